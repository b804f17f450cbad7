"""Time as the quota engine sees it, injectable so tests can step through windows and days.

Two readings: `monotonic()` for minute windows and lease expiry (never jumps when NTP steps
the wall clock), `wall()` (Unix seconds) only to name the UTC day and month a budget is in.
"""

from __future__ import annotations

import calendar
import time
from typing import Protocol

SECONDS_PER_DAY = 86_400


class Clock(Protocol):
    def monotonic(self) -> float: ...

    def wall(self) -> float: ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()


class ManualClock:
    """A clock that moves only when told; usage: `clock.advance(61)`."""

    def __init__(self, *, monotonic: float = 1_000.0, wall: float = 1_700_000_000.0) -> None:
        self._monotonic = monotonic
        self._wall = wall

    def monotonic(self) -> float:
        return self._monotonic

    def wall(self) -> float:
        return self._wall

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"a clock does not go back: advance({seconds})")
        self._monotonic += seconds
        self._wall += seconds


def utc_day(wall: float) -> str:
    """`2025-03-01`: the UTC calendar day a daily budget belongs to."""
    return time.strftime("%Y-%m-%d", time.gmtime(wall))


def utc_month(wall: float) -> str:
    """`2025-03`: the UTC calendar month a monthly budget belongs to."""
    return time.strftime("%Y-%m", time.gmtime(wall))


def seconds_to_next_day(wall: float) -> float:
    # Unix time has no leap seconds, so UTC days are exactly 86,400 s long here.
    return SECONDS_PER_DAY - (wall % SECONDS_PER_DAY)


def seconds_to_next_month(wall: float) -> float:
    now = time.gmtime(wall)
    year, month = (now.tm_year + 1, 1) if now.tm_mon == 12 else (now.tm_year, now.tm_mon + 1)
    return calendar.timegm((year, month, 1, 0, 0, 0)) - wall


class UtcPeriods:
    """`(day, month)` names for a wall time, recomputed only when the UTC day changes
    (formatting dates on every request is a measurable part of an admission)."""

    __slots__ = ("_day_end", "_day_start", "_names")

    def __init__(self) -> None:
        self._day_start = self._day_end = 0.0
        self._names = ("", "")

    def at(self, wall: float) -> tuple[str, str]:
        if not self._day_start <= wall < self._day_end:
            self._day_start = wall - (wall % SECONDS_PER_DAY)
            self._day_end = self._day_start + SECONDS_PER_DAY
            self._names = (utc_day(wall), utc_month(wall))
        return self._names
