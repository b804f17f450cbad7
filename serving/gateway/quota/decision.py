"""What admission decides, as one pure function: `decide` (limits + what each scope holds +
the need + now -> admit, or the `Refusal` with the longest wait), and the rate-limit state
either way (`rate_limit_status`) (docs/architecture.md, quota semantics).

Rules:
- every store decides with these: `InMemoryQuotaStore` calls them, the Redis reserve script
  applies the same admit condition and `decide` names its refusal, so the two cannot
  disagree on what is refused or for how long;
- a lease is known by its id (unique across stores and replicas, never object identity) and
  ends exactly once: settled, aborted, failed, withdrawn or expired; ending an ended lease
  is a no-op that says so (False);
- minute limits and concurrency refuse as `rate_limit_exceeded`, spent day/month budgets as
  `insufficient_quota`; every refusal has a finite `Retry-After`;
- the `x-ratelimit-*` state is the minute windows after this reservation; where a key and
  its per-model override both limit a dimension, the one with less left is shown.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

from serving.gateway.quota.limits import Limits, Scope, ScopedLimits
from serving.gateway.quota.windows import (
    WINDOW_SECONDS,
    seconds_to_next_day,
    seconds_to_next_month,
    window_reset,
    window_wait,
)


class LeaseState(enum.Enum):
    ACTIVE = "active"
    SETTLED = "settled"
    ABORTED = "aborted"
    FAILED = "failed"
    # Refused after admission, before anything reached the upstream (a check that runs
    # after the reservation because it is expensive): nothing is consumed, the request
    # itself included, so it leaves requests/min as a refusal before admission would.
    WITHDRAWN = "withdrawn"
    EXPIRED = "expired"


@dataclass(slots=True, eq=False)
class Lease:
    """Issued by a store; the proxy only passes it back to end it. The store recognises it
    by `lease_id` and records here how it ended (`state`, `charged_tokens`) as far as this
    process knows."""

    lease_id: str
    scopes: tuple[Scope, ...]
    prompt_estimate: int
    max_tokens: int
    # Where the reservation was booked, so the settlement corrects that same bucket and period.
    bucket: int
    day: str
    month: str
    expires_at: float  # on the issuing store's clock
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


class MinuteUsage(NamedTuple):
    """A minute window as seen from the current bucket: what it holds, and per bucket (oldest
    first, only those still in the span) where that is, which says when room comes back."""

    used: int
    buckets: Mapping[int, int]


class ScopeState(NamedTuple):
    """What one scope holds now, reservations of running requests included; day and month
    are the current UTC period's."""

    in_flight: int
    requests: MinuteUsage
    tokens: MinuteUsage
    tokens_today: int
    tokens_this_month: int


# A concurrency slot frees whenever any request of the key ends; there is no better bound.
CONCURRENCY_RETRY_SECONDS = 1.0


def decide(
    scopes: Sequence[ScopedLimits],
    states: Sequence[ScopeState],
    tokens: int,
    now: float,
    wall: float,
) -> Refusal | None:
    """None when every limit of every scope admits one more request holding `tokens` and a
    slot; otherwise the refusal with the longest wait (on a tie, the more lasting reason,
    then the first found). `now` is the window clock (buckets are its whole seconds),
    `wall` Unix time (it names the day and month)."""
    refusal: Refusal | None = None
    for (scope, limits), state in zip(scopes, states, strict=True):
        for candidate in _refusals(scope, limits, state, tokens, now, wall):
            if refusal is None or candidate.sort_key > refusal.sort_key:
                refusal = candidate
    return refusal


def _refusals(
    scope: Scope, limits: Limits, state: ScopeState, tokens: int, now: float, wall: float
) -> list[Refusal]:
    """Each limit of `scope` that does not admit the request, in a fixed order."""
    refusals: list[Refusal] = []
    limit = limits.max_concurrency
    if limit is not None and state.in_flight + 1 > limit:
        wait = CONCURRENCY_RETRY_SECONDS if limit > 0 else math.inf
        refusals.append(Refusal(RefusalReason.CONCURRENCY, scope, limit, state.in_flight, 1, wait))
    limit = limits.rpm
    if limit is not None and state.requests.used + 1 > limit:
        used, buckets = state.requests
        wait = window_wait(buckets, used, 1, limit, now)
        refusals.append(Refusal(RefusalReason.RPM, scope, limit, used, 1, wait))
    limit = limits.tpm
    if limit is not None and state.tokens.used + tokens > limit:
        used, buckets = state.tokens
        wait = window_wait(buckets, used, tokens, limit, now)
        refusals.append(Refusal(RefusalReason.TPM, scope, limit, used, tokens, wait))
    limit = limits.tokens_per_day
    if limit is not None and state.tokens_today + tokens > limit:
        wait = seconds_to_next_day(wall) if tokens <= limit else math.inf
        spent = state.tokens_today
        refusals.append(Refusal(RefusalReason.DAILY, scope, limit, spent, tokens, wait))
    limit = limits.tokens_per_month
    if limit is not None and state.tokens_this_month + tokens > limit:
        wait = seconds_to_next_month(wall) if tokens <= limit else math.inf
        spent = state.tokens_this_month
        refusals.append(Refusal(RefusalReason.MONTHLY, scope, limit, spent, tokens, wait))
    return refusals


def rate_limit_status(
    scopes: Sequence[ScopedLimits], states: Sequence[ScopeState], now: float
) -> RateLimitStatus:
    """The minute windows of `scopes`: per dimension, the scope with the least left."""
    requests: WindowStatus | None = None
    tokens: WindowStatus | None = None
    for (_, limits), state in zip(scopes, states, strict=True):
        if limits.rpm is not None:
            requests = _tighter(requests, limits.rpm, state.requests, now)
        if limits.tpm is not None:
            tokens = _tighter(tokens, limits.tpm, state.tokens, now)
    return RateLimitStatus(requests, tokens)


def _tighter(
    current: WindowStatus | None, limit: int, window: MinuteUsage, now: float
) -> WindowStatus:
    """`window` under `limit` if it has less left than `current` (the first on a tie). Its
    reset is looked up only then: this runs for every request."""
    remaining = max(0, limit - window.used)
    if current is not None and remaining >= current.remaining:
        return current
    return WindowStatus(limit, remaining, window_reset(window.buckets, now))
