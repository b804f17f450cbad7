"""Time and the counters that live in it: clocks, a sliding minute, calendar budgets
(docs/gateway.md, limits).

Rules:
- `monotonic()` times minute windows and lease expiry (NTP steps never move it); `wall()`
  (Unix seconds) only names the UTC day and month a budget is in; clocks are injectable, so
  tests step through windows and days (`ManualClock`);
- a minute limit holds for every 60 s interval, aligned or not (`SlidingWindow`); capacity
  comes back after 60-61 s;
- charges are booked in the bucket of admission, so a long stream counts against the minute
  it started in.
"""

from __future__ import annotations

import calendar
import math
import time
from collections.abc import Mapping
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


# Buckets are 1 s wide, so bucket numbers are whole monotonic seconds.
WINDOW_SECONDS = 60
# The current bucket plus the 60 before it, see `SlidingWindow`.
SPAN_BUCKETS = WINDOW_SECONDS + 1


def bucket_of(monotonic: float) -> int:
    return math.floor(monotonic)


def window_wait(buckets: Mapping[int, int], used: int, need: int, limit: int, now: float) -> float:
    """Seconds until `need` more fits under `limit` in a window holding `used` in `buckets`
    (bucket -> amount, oldest first, those in the span only): 0 if it fits now, inf if never.

    The first buckets to leave are the oldest, so the wait is until enough of them have."""
    if need > limit:
        return math.inf
    excess = used + need - limit
    if excess <= 0:
        return 0.0
    for bucket, amount in buckets.items():
        excess -= amount
        if excess <= 0:
            return leaves_at(bucket) - now
    return math.inf  # unreachable while amounts are non-negative


def window_reset(buckets: Mapping[int, int], now: float) -> float:
    """Seconds until the window holds nothing again (OpenAI's `x-ratelimit-reset-*`): when
    its newest bucket with something in it leaves."""
    for bucket in reversed(buckets):
        if buckets[bucket] > 0:
            return max(0.0, leaves_at(bucket) - now)
    return 0.0


def leaves_at(bucket: int) -> float:
    """When a bucket stops counting: it is in the span of the 60 buckets after it too."""
    return float(bucket + SPAN_BUCKETS)


class SlidingWindow:
    """Amounts per 1 s bucket over the last `SPAN_BUCKETS` buckets, with a running total.

    A request is checked against the current bucket and the 60 before it, which bounds every
    real 60 s interval, not just aligned ones: let t be the last admission in the interval;
    every earlier one in it happened after t - 60, so sits in bucket >= floor(t) - 60, and all
    were counted when t was checked (settling only lowers a bucket). A fixed 60 s window would
    let 2x the limit through across its edge.
    """

    __slots__ = ("_buckets", "_total")

    def __init__(self) -> None:
        # Insertion order is bucket order: new amounts only ever land in the newest bucket.
        self._buckets: dict[int, int] = {}
        self._total = 0

    def used(self, bucket: int) -> int:
        """What the window holds as seen from `bucket` (the current one)."""
        self._expire(bucket)
        return self._total

    def view(self, bucket: int) -> tuple[int, Mapping[int, int]]:
        """`(used, buckets)` as seen from `bucket`, for `window_wait` and `window_reset`; the
        mapping is the window's own (read it before the window changes again)."""
        self._expire(bucket)
        return self._total, self._buckets

    def add(self, bucket: int, amount: int) -> None:
        """Book `amount` (negative to refund) in `bucket`; a bucket already gone is ignored."""
        held = self._buckets.get(bucket)
        if held is not None:
            self._buckets[bucket] = held + amount
        elif not self._buckets or bucket > next(reversed(self._buckets)):
            self._buckets[bucket] = amount
        else:
            return  # expired: it no longer counts against anything
        self._total += amount

    def retry_after(self, bucket: int, now: float, need: int, limit: int) -> float:
        """Seconds until `need` more fits under `limit` (0 if it fits now, inf if never)."""
        self._expire(bucket)
        return window_wait(self._buckets, self._total, need, limit, now)

    def reset_after(self, bucket: int, now: float) -> float:
        """Seconds until the window holds nothing again (OpenAI's `x-ratelimit-reset-*`)."""
        self._expire(bucket)
        return window_reset(self._buckets, now)

    def _expire(self, bucket: int) -> None:
        oldest_kept = bucket - WINDOW_SECONDS
        while self._buckets:
            first = next(iter(self._buckets))
            if first >= oldest_kept:
                break
            self._total -= self._buckets.pop(first)


class PeriodCounter:
    """Tokens spent in one named calendar period (a UTC day or month); resets when it changes."""

    __slots__ = ("period", "spent")

    def __init__(self, period: str, spent: int = 0) -> None:
        self.period = period
        self.spent = spent

    def spent_in(self, period: str) -> int:
        if period != self.period:
            self.period, self.spent = period, 0
        return self.spent

    def add(self, period: str, amount: int) -> bool:
        """Book `amount` in `period` if that is still the current one; False if it is over."""
        if period != self.period:
            if period < self.period:
                return False  # a refund for yesterday: yesterday's budget no longer matters
            self.period, self.spent = period, 0
        self.spent += amount
        return True
