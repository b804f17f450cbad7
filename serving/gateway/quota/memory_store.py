"""The embedded quota store: counters in this process, for one gateway.

`InMemoryQuotaStore` is meant for one gateway process on one asyncio loop. Its methods are
coroutines only to fit `QuotaStore`: none of them awaits anything, so each call is atomic
with respect to other requests on the loop and no locks are needed. Several processes
sharing keys need a shared store instead (`redis_store`): counters here are per process.

Admission reads each scope's counters into `decision.ScopeState`s and lets `decision.decide`
rule, the same function the Redis store's answers go through.

With a journal, day and month counters start from the totals it holds for the current day
and month, and every lease that ends hands its final charge to the journal (which only
queues it; see `journal`). Reservations stay in memory: they are not spending yet.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from serving.gateway.quota.decision import (
    Lease,
    LeaseState,
    MinuteUsage,
    RateLimitStatus,
    Refusal,
    ScopeState,
    decide,
    rate_limit_status,
)
from serving.gateway.quota.journal import BudgetJournal, Charge
from serving.gateway.quota.limits import Scope, ScopedLimits
from serving.gateway.quota.store import LeaseIds, ScopeUsage, check_ending, check_reservation
from serving.gateway.quota.windows import (
    Clock,
    PeriodCounter,
    SlidingWindow,
    SystemClock,
    UtcPeriods,
    bucket_of,
    utc_day,
    utc_month,
)


class _Counters:
    __slots__ = ("day", "in_flight", "month", "requests", "tokens")

    def __init__(self, day: PeriodCounter, month: PeriodCounter) -> None:
        self.requests = SlidingWindow()
        self.tokens = SlidingWindow()
        self.day = day
        self.month = month
        self.in_flight = 0

    def state(self, bucket: int, day: str, month: str) -> ScopeState:
        return ScopeState(
            self.in_flight,
            MinuteUsage(*self.requests.view(bucket)),
            MinuteUsage(*self.tokens.view(bucket)),
            self.day.spent_in(day),
            self.month.spent_in(month),
        )

    def windows(self, bucket: int) -> ScopeState:
        """The minute windows alone (all `rate_limit_status` reads), without the calendar."""
        requests = MinuteUsage(*self.requests.view(bucket))
        return ScopeState(self.in_flight, requests, MinuteUsage(*self.tokens.view(bucket)), 0, 0)


class InMemoryQuotaStore:
    """Usage: `InMemoryQuotaStore(journal=SqliteBudgetJournal(path))`; close the journal
    at shutdown (that writes the charges still queued)."""

    def __init__(self, clock: Clock | None = None, *, journal: BudgetJournal | None = None) -> None:
        self._clock = clock or SystemClock()
        self._journal = journal
        self._scopes: dict[Scope, _Counters] = {}
        self._leases: dict[str, Lease] = {}
        # (expires_at, lease_id). Ended or renewed leases leave stale entries behind, which
        # `_schedule` compacts away so the heap stays proportional to the live leases.
        self._expiries: list[tuple[float, str]] = []
        self._ids = LeaseIds()
        self._periods = UtcPeriods()
        wall = self._clock.wall()
        # Budgets as journaled for the day and month of start-up; a scope's counters start
        # from them and reset by themselves once the period they belong to is over.
        self._loaded_day, self._loaded_month = utc_day(wall), utc_month(wall)
        self._persisted = journal.load(self._loaded_day, self._loaded_month) if journal else {}

    async def try_reserve(
        self, scopes: Sequence[ScopedLimits], prompt_tokens: int, max_tokens: int, ttl: float
    ) -> tuple[Lease | Refusal, RateLimitStatus]:
        check_reservation(prompt_tokens, max_tokens, ttl)
        now = self._clock.monotonic()
        wall = self._clock.wall()
        expiries = self._expiries
        if expiries and expiries[0][0] <= now:
            self._reclaim(now)
        bucket = bucket_of(now)
        day, month = self._periods.at(wall)
        tokens = prompt_tokens + max_tokens
        counters = [self._counters(scope) for scope, _ in scopes]
        states = [c.state(bucket, day, month) for c in counters]
        # Decide on everything before booking anything: a refusal must consume nothing.
        refusal = decide(scopes, states, tokens, now, wall)
        if refusal is not None:
            return refusal, rate_limit_status(scopes, states, now)
        for scope_counters in counters:
            scope_counters.in_flight += 1
            scope_counters.requests.add(bucket, 1)
            scope_counters.tokens.add(bucket, tokens)
            scope_counters.day.add(day, tokens)
            scope_counters.month.add(month, tokens)
        # The windows as booked: their bucket maps are the windows' own (read above, and the
        # bookings went into them), their totals the ones read plus what was just added.
        booked = [
            ScopeState(
                state.in_flight + 1,
                MinuteUsage(state.requests.used + 1, state.requests.buckets),
                MinuteUsage(state.tokens.used + tokens, state.tokens.buckets),
                state.tokens_today + tokens,
                state.tokens_this_month + tokens,
            )
            for state in states
        ]
        status = rate_limit_status(scopes, booked, now)
        lease = Lease(
            lease_id=self._ids.next(),
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
        return lease, status

    async def finish(self, lease: Lease, state: LeaseState, charged_tokens: int) -> bool:
        check_ending(state)
        issued = self._leases.pop(lease.lease_id, None)
        if issued is None:
            return False  # ended, expired, or issued by another store
        self._end(issued, state, charged_tokens)
        if lease is not issued:  # the same lease, passed back as another object
            lease.state, lease.charged_tokens = issued.state, issued.charged_tokens
        return True

    async def renew(self, lease: Lease, ttl: float) -> bool:
        issued = self._leases.get(lease.lease_id)
        if issued is None:
            return False
        issued.expires_at = lease.expires_at = self._clock.monotonic() + ttl
        self._schedule(issued)
        return True

    async def reclaim_expired(self) -> int:
        return self._reclaim(self._clock.monotonic())

    def active_leases(self) -> int:
        return len(self._leases)

    def holds(self, lease_id: str) -> bool:
        """Whether this store issued the lease and it has not ended (nor been reclaimed)."""
        return lease_id in self._leases

    async def status(self, scopes: Sequence[ScopedLimits]) -> RateLimitStatus:
        now = self._clock.monotonic()
        bucket = bucket_of(now)
        return rate_limit_status(
            scopes, [self._counters(scope).windows(bucket) for scope, _ in scopes], now
        )

    async def usage(self, scope: Scope) -> ScopeUsage:
        now = self._clock.monotonic()
        day, month = self._periods.at(self._clock.wall())
        state = self._counters(scope).state(bucket_of(now), day, month)
        return ScopeUsage.of(state)

    def _counters(self, scope: Scope) -> _Counters:
        counters = self._scopes.get(scope)
        if counters is None:
            counters = _Counters(
                PeriodCounter(self._loaded_day, self._persisted.pop((scope, "day"), 0)),
                PeriodCounter(self._loaded_month, self._persisted.pop((scope, "month"), 0)),
            )
            self._scopes[scope] = counters
        return counters

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
            counters = self._scopes[scope]
            counters.in_flight -= 1
            if state is LeaseState.WITHDRAWN:
                counters.requests.add(lease.bucket, -1)
            if delta:
                counters.tokens.add(lease.bucket, delta)
                counters.day.add(lease.day, delta)
                counters.month.add(lease.month, delta)
        if self._journal is not None and charged_tokens:
            self._journal.record(Charge(lease.scopes, lease.day, lease.month, charged_tokens))
