import pytest

from serving.gateway.quota.clock import (
    ManualClock,
    UtcPeriods,
    seconds_to_next_day,
    seconds_to_next_month,
    utc_day,
    utc_month,
)
from tests.gateway.quota.subjects import utc


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
