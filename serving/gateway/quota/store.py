"""Where quota state lives, as a few atomic operations, and the embedded in-memory store.

Each call checks and changes everything it touches in one step, so a store can be an
in-process object on one event loop (`InMemoryQuotaStore`) or a script run per call on a
shared server, without the engine above changing.

`InMemoryQuotaStore` is meant for one gateway process on one asyncio loop. Every method is
synchronous and does not await, so each call is atomic with respect to other requests on the
loop and no locks are needed. Several processes sharing keys need a shared store instead:
counters here are per process. With a journal, day and month counters start from the totals
it holds for the current day and month, and every lease that ends hands its final charge to
the journal (which only queues it; see `journal`). Reservations stay in memory: they are not
spending yet.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Sequence
from typing import NamedTuple, Protocol

from serving.gateway.quota.decision import (
    Lease,
    LeaseState,
    RateLimitStatus,
    Refusal,
    RefusalReason,
    WindowStatus,
)
from serving.gateway.quota.journal import BudgetJournal, Charge
from serving.gateway.quota.limits import Limits, Scope, ScopedLimits
from serving.gateway.quota.windows import (
    Clock,
    PeriodCounter,
    SlidingWindow,
    SystemClock,
    UtcPeriods,
    bucket_of,
    seconds_to_next_day,
    seconds_to_next_month,
    utc_day,
    utc_month,
)


class ScopeUsage(NamedTuple):
    """What one scope holds now (reservations of in-flight requests included)."""

    in_flight: int
    requests_in_window: int
    tokens_in_window: int
    tokens_today: int
    tokens_this_month: int


class QuotaStore(Protocol):
    def try_reserve(
        self, scopes: Sequence[ScopedLimits], prompt_tokens: int, max_tokens: int, ttl: float
    ) -> tuple[Lease | Refusal, RateLimitStatus]:
        """All or nothing: if every limit of every scope admits one more request holding
        `prompt_tokens + max_tokens` tokens and a slot, book all of it and return the lease;
        otherwise change nothing and return the refusal with the longest wait. Either way,
        with the rate-limit state as it is after the call (what `status` would say), so
        one call reserves and reports."""
        ...

    def finish(self, lease: Lease, state: LeaseState, charged_tokens: int) -> bool:
        """End an active lease: free its slot, replace its reservation by `charged_tokens`.
        False (and nothing changes) if the lease had already ended or expired."""
        ...

    def renew(self, lease: Lease, ttl: float) -> bool:
        """Push an active lease's expiry to now + ttl (long streams); False if it ended."""
        ...

    def reclaim_expired(self) -> int:
        """End leases past their expiry, keeping their full reservation charged."""
        ...

    def active_leases(self) -> int:
        """Leases issued and not yet ended (0 when no request is running)."""
        ...

    def status(self, scopes: Sequence[ScopedLimits]) -> RateLimitStatus: ...

    def usage(self, scope: Scope) -> ScopeUsage: ...


# A concurrency slot frees whenever any request of the key ends; there is no better bound.
CONCURRENCY_RETRY_SECONDS = 1.0


class _ScopeState:
    __slots__ = ("day", "in_flight", "month", "requests", "tokens")

    def __init__(self, day: PeriodCounter, month: PeriodCounter) -> None:
        self.requests = SlidingWindow()
        self.tokens = SlidingWindow()
        self.day = day
        self.month = month
        self.in_flight = 0


class InMemoryQuotaStore:
    """Usage: `InMemoryQuotaStore(journal=SqliteBudgetJournal(path))`; close the journal
    at shutdown (that writes the charges still queued)."""

    def __init__(self, clock: Clock | None = None, *, journal: BudgetJournal | None = None) -> None:
        self._clock = clock or SystemClock()
        self._journal = journal
        self._scopes: dict[Scope, _ScopeState] = {}
        self._leases: dict[int, Lease] = {}
        # (expires_at, lease_id). Ended or renewed leases leave stale entries behind, which
        # `_schedule` compacts away so the heap stays proportional to the live leases.
        self._expiries: list[tuple[float, int]] = []
        self._ids = itertools.count(1)
        self._periods = UtcPeriods()
        wall = self._clock.wall()
        # Budgets as journaled for the day and month of start-up; a scope's counters start
        # from them and reset by themselves once the period they belong to is over.
        self._loaded_day, self._loaded_month = utc_day(wall), utc_month(wall)
        self._persisted = journal.load(self._loaded_day, self._loaded_month) if journal else {}

    def try_reserve(
        self, scopes: Sequence[ScopedLimits], prompt_tokens: int, max_tokens: int, ttl: float
    ) -> tuple[Lease | Refusal, RateLimitStatus]:
        now = self._clock.monotonic()
        wall = self._clock.wall()
        expiries = self._expiries
        if expiries and expiries[0][0] <= now:
            self._reclaim(now)
        bucket = bucket_of(now)
        day, month = self._periods.at(wall)
        tokens = prompt_tokens + max_tokens
        states = [self._state(scope) for scope, _ in scopes]
        # Check everything before booking anything: a refusal must consume nothing.
        refusals: list[Refusal] = []
        for (scope, limits), state in zip(scopes, states, strict=True):
            _check(refusals, scope, limits, state, tokens, bucket, now, wall, day, month)
        if refusals:
            refusal = max(refusals, key=lambda refusal: refusal.sort_key)
            return refusal, _status(scopes, states, bucket, now)
        for state in states:
            state.in_flight += 1
            state.requests.add(bucket, 1)
            state.tokens.add(bucket, tokens)
            state.day.add(day, tokens)
            state.month.add(month, tokens)
        lease = Lease(
            lease_id=next(self._ids),
            scopes=tuple(scope for scope, _ in scopes),
            prompt_estimate=prompt_tokens,
            max_tokens=max_tokens,
            bucket=bucket,
            day=day,
            month=month,
            expires_at=now + ttl,
        )
        self._leases[lease.lease_id] = lease
        self._schedule(lease)
        return lease, _status(scopes, states, bucket, now)

    def finish(self, lease: Lease, state: LeaseState, charged_tokens: int) -> bool:
        if state in (LeaseState.ACTIVE, LeaseState.EXPIRED):
            raise ValueError(f"finish() ends a lease; {state} is not an ending")
        # The identity check refuses a lease this store did not issue (or already ended).
        if self._leases.get(lease.lease_id) is not lease or not lease.active:
            return False
        del self._leases[lease.lease_id]
        self._end(lease, state, charged_tokens)
        return True

    def renew(self, lease: Lease, ttl: float) -> bool:
        if self._leases.get(lease.lease_id) is not lease or not lease.active:
            return False
        lease.expires_at = self._clock.monotonic() + ttl
        self._schedule(lease)
        return True

    def reclaim_expired(self) -> int:
        return self._reclaim(self._clock.monotonic())

    def active_leases(self) -> int:
        return len(self._leases)

    def status(self, scopes: Sequence[ScopedLimits]) -> RateLimitStatus:
        now = self._clock.monotonic()
        states = [self._state(scope) for scope, _ in scopes]
        return _status(scopes, states, bucket_of(now), now)

    def usage(self, scope: Scope) -> ScopeUsage:
        now = self._clock.monotonic()
        day, month = self._periods.at(self._clock.wall())
        state = self._state(scope)
        bucket = bucket_of(now)
        return ScopeUsage(
            in_flight=state.in_flight,
            requests_in_window=state.requests.used(bucket),
            tokens_in_window=state.tokens.used(bucket),
            tokens_today=state.day.spent_in(day),
            tokens_this_month=state.month.spent_in(month),
        )

    def _state(self, scope: Scope) -> _ScopeState:
        state = self._scopes.get(scope)
        if state is None:
            state = _ScopeState(
                PeriodCounter(self._loaded_day, self._persisted.pop((scope, "day"), 0)),
                PeriodCounter(self._loaded_month, self._persisted.pop((scope, "month"), 0)),
            )
            self._scopes[scope] = state
        return state

    def _schedule(self, lease: Lease) -> None:
        if len(self._expiries) > 2 * len(self._leases) + 64:
            self._expiries = [(live.expires_at, live.lease_id) for live in self._leases.values()]
            heapq.heapify(self._expiries)
            return  # the rebuild holds this (live) lease's current expiry too
        heapq.heappush(self._expiries, (lease.expires_at, lease.lease_id))

    def _reclaim(self, now: float) -> int:
        reclaimed = 0
        while self._expiries and self._expiries[0][0] <= now:
            _, lease_id = heapq.heappop(self._expiries)
            lease = self._leases.get(lease_id)
            if lease is None or lease.expires_at > now:
                continue  # ended already, or renewed (a later entry exists)
            del self._leases[lease_id]
            # Nobody reported usage, so the whole reservation stays charged.
            self._end(lease, LeaseState.EXPIRED, lease.reserved_tokens)
            reclaimed += 1
        return reclaimed

    def _end(self, lease: Lease, state: LeaseState, charged_tokens: int) -> None:
        lease.state = state
        lease.charged_tokens = charged_tokens
        delta = charged_tokens - lease.reserved_tokens
        for scope in lease.scopes:
            scope_state = self._scopes[scope]
            scope_state.in_flight -= 1
            if delta:
                scope_state.tokens.add(lease.bucket, delta)
                scope_state.day.add(lease.day, delta)
                scope_state.month.add(lease.month, delta)
        if self._journal is not None and charged_tokens:
            self._journal.record(Charge(lease.scopes, lease.day, lease.month, charged_tokens))


def _check(
    refusals: list[Refusal],
    scope: Scope,
    limits: Limits,
    state: _ScopeState,
    tokens: int,
    bucket: int,
    now: float,
    wall: float,
    day: str,
    month: str,
) -> None:
    """Append to `refusals` each limit of `scope` that does not admit the request."""
    if limits.max_concurrency is not None and state.in_flight + 1 > limits.max_concurrency:
        wait = CONCURRENCY_RETRY_SECONDS if limits.max_concurrency > 0 else math.inf
        refusals.append(
            Refusal(
                RefusalReason.CONCURRENCY, scope, limits.max_concurrency, state.in_flight, 1, wait
            )
        )
    if limits.rpm is not None:
        used = state.requests.used(bucket)
        if used + 1 > limits.rpm:
            wait = state.requests.retry_after(bucket, now, 1, limits.rpm)
            refusals.append(Refusal(RefusalReason.RPM, scope, limits.rpm, used, 1, wait))
    if limits.tpm is not None:
        used = state.tokens.used(bucket)
        if used + tokens > limits.tpm:
            wait = state.tokens.retry_after(bucket, now, tokens, limits.tpm)
            refusals.append(Refusal(RefusalReason.TPM, scope, limits.tpm, used, tokens, wait))
    if limits.tokens_per_day is not None:
        limit = limits.tokens_per_day
        spent = state.day.spent_in(day)
        if spent + tokens > limit:
            wait = seconds_to_next_day(wall) if tokens <= limit else math.inf
            refusals.append(Refusal(RefusalReason.DAILY, scope, limit, spent, tokens, wait))
    if limits.tokens_per_month is not None:
        limit = limits.tokens_per_month
        spent = state.month.spent_in(month)
        if spent + tokens > limit:
            wait = seconds_to_next_month(wall) if tokens <= limit else math.inf
            refusals.append(Refusal(RefusalReason.MONTHLY, scope, limit, spent, tokens, wait))


def _status(
    scopes: Sequence[ScopedLimits], states: Sequence[_ScopeState], bucket: int, now: float
) -> RateLimitStatus:
    """The minute windows of `scopes` as seen from `bucket`: per dimension, the scope with
    the least left."""
    requests: WindowStatus | None = None
    tokens: WindowStatus | None = None
    for (_, limits), state in zip(scopes, states, strict=True):
        if limits.rpm is not None:
            requests = _tighter(requests, _window_status(state.requests, limits.rpm, bucket, now))
        if limits.tpm is not None:
            tokens = _tighter(tokens, _window_status(state.tokens, limits.tpm, bucket, now))
    return RateLimitStatus(requests=requests, tokens=tokens)


def _window_status(window: SlidingWindow, limit: int, bucket: int, now: float) -> WindowStatus:
    used, reset_after = window.snapshot(bucket, now)
    return WindowStatus(limit, max(0, limit - used), reset_after)


def _tighter(current: WindowStatus | None, candidate: WindowStatus) -> WindowStatus:
    if current is None or candidate.remaining < current.remaining:
        return candidate
    return current
