"""What admission decides: a `Lease` to proceed with, or a `Refusal` (a 429), and the
rate-limit state either way.

A lease is one admitted request's hold on a concurrency slot and its token reservation. It
ends exactly once: settled (response done), aborted (client went away), failed (upstream
produced nothing) or expired (nobody ended it within its time to live, e.g. a bug or a
crashed replica). Ending an ended lease is a no-op, so cleanup paths may overlap.

A refusal maps to OpenAI's error shape (DESIGN.md section 5): minute limits and concurrency
are `requests`/`tokens` + `rate_limit_exceeded`; spent day/month budgets are
`insufficient_quota`. Every refusal has a finite `Retry-After`.

The rate-limit state is what OpenAI reports in the `x-ratelimit-*` response headers: the
key's (or key+model's) minute windows after this request's reservation; where a key and its
per-model override both limit a dimension, the one with less left is shown. A dimension
without a limit gets no headers (there is nothing true to say).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

from serving.gateway.quota.limits import Scope
from serving.gateway.quota.windows import WINDOW_SECONDS


class LeaseState(enum.Enum):
    ACTIVE = "active"
    SETTLED = "settled"
    ABORTED = "aborted"
    FAILED = "failed"
    EXPIRED = "expired"


@dataclass(slots=True, eq=False)
class Lease:
    """Owned by the store that issued it; the proxy only passes it back to end it."""

    lease_id: int
    scopes: tuple[Scope, ...]
    prompt_estimate: int
    max_tokens: int
    # Where the reservation was booked, so the settlement corrects that same bucket and period.
    bucket: int
    day: str
    month: str
    expires_at: float
    state: LeaseState = LeaseState.ACTIVE
    charged_tokens: int | None = None

    @property
    def key_id(self) -> str:
        return self.scopes[0].key_id

    @property
    def reserved_tokens(self) -> int:
        return self.prompt_estimate + self.max_tokens

    @property
    def active(self) -> bool:
        return self.state is LeaseState.ACTIVE


class WindowStatus(NamedTuple):
    limit: int
    remaining: int
    reset_after: float  # seconds until the window is empty again


@dataclass(frozen=True, slots=True)
class RateLimitStatus:
    requests: WindowStatus | None = None
    tokens: WindowStatus | None = None


def format_reset(seconds: float) -> str:
    """OpenAI's (Go's) duration format: `20ms`, `1s`, `1.5s`, `6m0s`, `1h0m0s`.

    Rounded up to the millisecond: a client that waits exactly this long finds room again.
    """
    if seconds <= 0:
        return "0s"
    # Less a nanosecond first, so float noise (0.1 * 1000 = 100.00000000000001) does not add
    # 1 ms.
    millis = math.ceil(seconds * 1000 - 1e-6)
    if millis < 1000:
        return f"{millis}ms"
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    whole, fraction = divmod(millis, 1000)
    secs = f"{whole}.{fraction:03d}".rstrip("0") if fraction else str(whole)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


# `format_reset` as header bytes, by whole milliseconds: a minute window's resets are at most
# 61,000 distinct values, and formatting one costs more than the rest of the headers.
_RESET_CACHE_SIZE = 65_536
_reset_values: dict[int, bytes] = {}


def _reset_value(seconds: float) -> bytes:
    millis = math.ceil(seconds * 1000 - 1e-6) if seconds > 0 else 0
    value = _reset_values.get(millis)
    if value is None:
        value = format_reset(millis / 1000).encode() if millis else b"0s"
        if len(_reset_values) >= _RESET_CACHE_SIZE:
            _reset_values.clear()
        _reset_values[millis] = value
    return value


def rate_limit_headers(status: RateLimitStatus) -> dict[str, str]:
    headers: dict[str, str] = {}
    for name, window in (("requests", status.requests), ("tokens", status.tokens)):
        if window is None:
            continue
        headers[f"x-ratelimit-limit-{name}"] = str(window.limit)
        headers[f"x-ratelimit-remaining-{name}"] = str(window.remaining)
        headers[f"x-ratelimit-reset-{name}"] = format_reset(window.reset_after)
    return headers


_RAW_NAMES = {
    kind: tuple(f"x-ratelimit-{part}-{kind}".encode() for part in ("limit", "remaining", "reset"))
    for kind in ("requests", "tokens")
}


def rate_limit_raw_headers(status: RateLimitStatus) -> list[tuple[bytes, bytes]]:
    """`rate_limit_headers` as ASGI header pairs, built directly (once per request)."""
    headers: list[tuple[bytes, bytes]] = []
    for kind, window in (("requests", status.requests), ("tokens", status.tokens)):
        if window is not None:
            limit, remaining, reset = _RAW_NAMES[kind]
            headers.append((limit, b"%d" % window.limit))
            headers.append((remaining, b"%d" % window.remaining))
            headers.append((reset, _reset_value(window.reset_after)))
    return headers


class RefusalReason(enum.StrEnum):
    RPM = "rpm"
    TPM = "tpm"
    CONCURRENCY = "concurrency"
    DAILY = "daily"
    MONTHLY = "monthly"


# When several limits refuse at once the longest wait is reported; on a tie, the more
# lasting reason wins (a spent budget says more than a busy minute).
REASON_RANK = {
    RefusalReason.MONTHLY: 4,
    RefusalReason.DAILY: 3,
    RefusalReason.TPM: 2,
    RefusalReason.RPM: 1,
    RefusalReason.CONCURRENCY: 0,
}

_ERROR_TYPES = {
    RefusalReason.RPM: "requests",
    RefusalReason.TPM: "tokens",
    RefusalReason.CONCURRENCY: "requests",
    RefusalReason.DAILY: "insufficient_quota",
    RefusalReason.MONTHLY: "insufficient_quota",
}


_NO_STATUS = RateLimitStatus()  # immutable, so one shared default is safe


@dataclass(frozen=True, slots=True)
class Refusal:
    """One limit that said no. Nothing was consumed: not this limit, nor any other."""

    reason: RefusalReason
    scope: Scope
    limit: int
    used: int  # what the limit's counter holds now
    requested: int  # what this request needed: 1 request, a slot, or tokens
    retry_after: float  # seconds; math.inf when the request can never fit
    rate_limit: RateLimitStatus = _NO_STATUS

    status: ClassVar[int] = 429

    @property
    def error_type(self) -> str:
        return _ERROR_TYPES[self.reason]

    @property
    def code(self) -> str:
        if self.reason in (RefusalReason.DAILY, RefusalReason.MONTHLY):
            return "insufficient_quota"
        return "rate_limit_exceeded"

    @property
    def too_large(self) -> bool:
        """The request alone exceeds the limit: waiting will not help, a smaller one might."""
        return self.requested > self.limit

    @property
    def retry_after_header(self) -> str:
        """Whole seconds, at least 1; a request that never fits is told to wait one window."""
        if math.isinf(self.retry_after):
            return str(WINDOW_SECONDS)
        return str(max(1, math.ceil(self.retry_after)))

    @property
    def sort_key(self) -> tuple[float, int]:
        return self.retry_after, REASON_RANK[self.reason]

    @property
    def message(self) -> str:
        where = f"key {self.scope.key_id}"
        if self.scope.model is not None:
            where += f" for model {self.scope.model}"
        retry = f"Please try again in {self.retry_after_header}s."
        if self.reason is RefusalReason.CONCURRENCY:
            return f"Too many concurrent requests on {where}: limit {self.limit}. {retry}"
        if self.reason is RefusalReason.RPM:
            return (
                f"Rate limit reached for requests per minute on {where}: "
                f"limit {self.limit}, used {self.used}. {retry}"
            )
        what = {
            RefusalReason.TPM: "tokens per minute",
            RefusalReason.DAILY: "tokens per day (UTC)",
            RefusalReason.MONTHLY: "tokens per month (UTC)",
        }[self.reason]
        if self.too_large:
            return (
                f"Request too large for {what} on {where}: it needs {self.requested} tokens "
                f"(prompt estimate + max_tokens), the limit is {self.limit}. "
                "Lower max_tokens or shorten the prompt."
            )
        if self.reason is RefusalReason.TPM:
            return (
                f"Rate limit reached for {what} on {where}: limit {self.limit}, "
                f"used {self.used}, requested {self.requested}. {retry}"
            )
        return (
            f"Quota of {what} spent on {where}: limit {self.limit}, used {self.used}, "
            f"requested {self.requested}. {retry}"
        )


@dataclass(frozen=True, slots=True)
class Admission:
    """Go ahead: send `max_tokens` upstream (it may be lower than the client asked for)."""

    lease: Lease
    max_tokens: int
    rate_limit: RateLimitStatus
