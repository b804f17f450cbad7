"""UTC days, and how long the ledger keeps one.

A request's tokens belong to the UTC day it ended on. A day is kept `retention_days` days
after it: with a retention of 400, the usage of 2026-01-01 can be read until 2027-02-05
(2026-01-01 + 400 days) and is gone the day after, in keys.db (pruned by the writer) and in
Redis (an expiry on the day's hash) alike.
"""

from __future__ import annotations

import time
from datetime import date, timedelta

DEFAULT_RETENTION_DAYS = 400
"""Just over a year: a month's bill can still be checked a year later."""
DAY_S = 86_400


def utc_day(epoch: float) -> str:
    """`2026-03-01`: the UTC day of a time."""
    return time.strftime("%Y-%m-%d", time.gmtime(epoch))


def utc_today() -> date:
    """Today, as the ledger dates a request ending now."""
    return date.fromisoformat(utc_day(time.time()))


def day_span(epoch: float) -> tuple[str, float, float]:
    """The UTC day of a time, with its first second and the first second after it. POSIX
    time has no leap seconds, so every day is DAY_S long."""
    start = epoch - epoch % DAY_S
    return utc_day(start), start, start + DAY_S


def oldest_kept(today: str, retention_days: int) -> str:
    """The earliest day still kept on `today`."""
    return (date.fromisoformat(today) - timedelta(days=retention_days)).isoformat()


def expires_at(day: str, retention_days: int) -> int:
    """The first second at which `day` is no longer kept (Redis's EXPIREAT for its hash)."""
    after = date.fromisoformat(day) + timedelta(days=retention_days + 1)
    return (after - date(1970, 1, 1)).days * DAY_S


def days_from(first: str, last: str) -> list[str]:
    """Every day from `first` to `last`, both included (none when `last` is before)."""
    start, end = date.fromisoformat(first), date.fromisoformat(last)
    return [(start + timedelta(days=n)).isoformat() for n in range((end - start).days + 1)]
