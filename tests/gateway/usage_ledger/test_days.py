"""UTC days and retention: the same day is dropped from keys.db and from Redis."""

from __future__ import annotations

import calendar
from datetime import date

from serving.gateway.usage_ledger.days import (
    DAY_S,
    day_span,
    days_from,
    expires_at,
    oldest_kept,
    utc_day,
)


def epoch(text: str) -> int:
    return calendar.timegm(date.fromisoformat(text).timetuple())


def test_a_day_is_utc_and_exactly_a_day_long() -> None:
    start = epoch("2026-03-01")
    assert utc_day(start) == utc_day(start + DAY_S - 1) == "2026-03-01"
    assert utc_day(start - 1) == "2026-02-28"
    assert day_span(start + 3600.5) == ("2026-03-01", start, start + DAY_S)


def test_a_day_is_kept_retention_days_after_it_in_sqlite_and_redis_alike() -> None:
    # Kept on 2027-02-05 (400 days on), gone on 2027-02-06: SQLite deletes the days before
    # oldest_kept(today), Redis expires the day's hash at expires_at(day).
    assert oldest_kept("2027-02-05", 400) == "2026-01-01"
    assert oldest_kept("2027-02-06", 400) == "2026-01-02"
    assert expires_at("2026-01-01", 400) == epoch("2027-02-06")
    assert oldest_kept("2024-03-01", 1) == "2024-02-29"  # a leap day


def test_days_from_includes_both_ends() -> None:
    assert days_from("2024-02-28", "2024-03-01") == ["2024-02-28", "2024-02-29", "2024-03-01"]
    assert days_from("2026-03-01", "2026-03-01") == ["2026-03-01"]
    assert days_from("2026-03-02", "2026-03-01") == []
