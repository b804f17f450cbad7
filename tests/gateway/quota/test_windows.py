"""Clocks, the sliding minute and calendar budgets."""

import math

import pytest

from serving.gateway.quota.windows import (
    ManualClock,
    PeriodCounter,
    SlidingWindow,
    UtcPeriods,
    bucket_of,
    seconds_to_next_day,
    seconds_to_next_month,
    utc_day,
    utc_month,
)
from tests.gateway.quota.subjects import utc


def test_bucket_is_the_whole_second() -> None:
    assert bucket_of(1000.0) == 1000
    assert bucket_of(1000.999) == 1000
    assert bucket_of(1001.0) == 1001


def test_window_counts_the_current_and_sixty_previous_buckets() -> None:
    window = SlidingWindow()
    window.add(1000, 5)
    window.add(1030, 7)
    assert window.used(1030) == 12
    assert window.used(1060) == 12  # bucket 1000 is 60 buckets back: still counted
    assert window.used(1061) == 7  # now it is 61 back: gone
    assert window.used(1090) == 7
    assert window.used(1091) == 0


def test_refund_goes_to_the_bucket_of_admission_and_is_ignored_once_it_expired() -> None:
    window = SlidingWindow()
    window.add(1000, 100)
    window.add(1010, 50)
    window.add(1000, -60)  # settle of a request admitted in bucket 1000
    assert window.used(1010) == 90
    window.add(1000, -40)
    assert window.used(1061) == 50
    window.add(1000, -10)  # bucket 1000 expired: nothing to correct
    assert window.used(1061) == 50


def test_retry_after_is_when_enough_old_buckets_have_left() -> None:
    window = SlidingWindow()
    window.add(1000, 6)
    window.add(1010, 3)
    # limit 10, used 9: 1 fits now, 2 needs bucket 1000 gone (at t=1061), so does 7.
    assert window.retry_after(1020, 1020.5, 1, 10) == 0.0
    assert window.retry_after(1020, 1020.5, 2, 10) == 1061 - 1020.5
    assert window.retry_after(1020, 1020.5, 7, 10) == 1061 - 1020.5
    # 8 needs both gone: bucket 1010 leaves at 1071.
    assert window.retry_after(1020, 1020.5, 8, 10) == 1071 - 1020.5
    assert window.retry_after(1020, 1020.5, 11, 10) == math.inf


def test_reset_after_is_when_the_newest_nonzero_bucket_leaves() -> None:
    window = SlidingWindow()
    assert window.reset_after(1000, 1000.2) == 0.0
    window.add(1000, 4)
    window.add(1005, 1)
    assert window.reset_after(1005, 1005.5) == 1066 - 1005.5
    window.add(1005, -1)  # refunded to zero: only bucket 1000 still holds something
    assert window.reset_after(1005, 1005.5) == 1061 - 1005.5


def test_period_counter_resets_when_the_period_changes() -> None:
    counter = PeriodCounter("2024-01-31", 40)
    assert counter.spent_in("2024-01-31") == 40
    assert counter.add("2024-01-31", 10)
    assert counter.spent_in("2024-02-01") == 0
    # A refund for yesterday does not touch today.
    assert not counter.add("2024-01-31", -30)
    assert counter.spent_in("2024-02-01") == 0
    assert counter.add("2024-02-01", 5)
    assert counter.spent == 5


def test_calendar_names_are_utc() -> None:
    assert utc_day(utc(2024, 2, 29, 23, 59, 59)) == "2024-02-29"
    assert utc_day(utc(2024, 3, 1)) == "2024-03-01"
    assert utc_month(utc(2024, 12, 31, 23, 59, 59)) == "2024-12"


def test_seconds_to_the_next_period() -> None:
    assert seconds_to_next_day(utc(2024, 1, 31, 23, 59, 30)) == 30
    assert seconds_to_next_day(utc(2024, 1, 31)) == 86_400
    assert seconds_to_next_month(utc(2024, 1, 31, 23, 59, 30)) == 30
    assert seconds_to_next_month(utc(2024, 2, 28)) == 2 * 86_400  # leap year
    assert seconds_to_next_month(utc(2024, 12, 31, 12)) == 12 * 3600  # year rollover


def test_utc_periods_cache_follows_the_day() -> None:
    periods = UtcPeriods()
    assert periods.at(utc(2024, 1, 31, 23, 59, 59)) == ("2024-01-31", "2024-01")
    assert periods.at(utc(2024, 2, 1)) == ("2024-02-01", "2024-02")
    assert periods.at(utc(2024, 2, 1, 12)) == ("2024-02-01", "2024-02")


def test_manual_clock_moves_both_readings_and_never_back() -> None:
    clock = ManualClock(monotonic=5.0, wall=100.0)
    clock.advance(2.5)
    assert (clock.monotonic(), clock.wall()) == (7.5, 102.5)
    with pytest.raises(ValueError, match="does not go back"):
        clock.advance(-1)
