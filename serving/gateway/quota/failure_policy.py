"""What the gateway does while its shared quota store (Redis) cannot answer (docs/gateway.md,
shared quotas).

    store = GuardedQuotaStore(RedisQuotaStore.from_url(url), policy=FailurePolicy.CLOSED)
    await store.check()          # lease upkeep: probe, and once it answers, settle what waited

Rules:
- a call that fails or runs out of time gets the policy's answer within the same bound:
  `closed` raises `QuotaStoreUnavailable` (503, /readyz fails via `unready_reason`);
  `local` reserves against counters in this process, each limit divided by `replicas`
  (rounded down); local day/month budgets start from nothing and are not added to Redis;
- leases of the shared store are only ever ended there, by id: endings (and cancellations)
  wait while it cannot answer, and `check()` sends them once it does; an ending it refused
  waits here the same way; leases of the local fallback end locally;
- until its ending is delivered, a lease counts in `active_leases`;
- `up` and `errors` feed gateway_quota_store_up and gateway_quota_store_errors_total.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Sequence
from typing import Protocol

from serving.gateway.quota.decision import Lease, LeaseState, RateLimitStatus, Refusal
from serving.gateway.quota.limits import Limits, Scope, ScopedLimits
from serving.gateway.quota.memory_store import InMemoryQuotaStore
from serving.gateway.quota.store import QuotaStore, QuotaStoreUnavailable, ScopeUsage
from serving.gateway.quota.windows import Clock

logger = logging.getLogger(__name__)

UNAVAILABLE = "quota store unavailable"


class FailurePolicy(enum.StrEnum):
    CLOSED = "closed"
    LOCAL = "local"


class SharedQuotaStore(QuotaStore, Protocol):
    async def ping(self) -> None:
        """Raise `QuotaStoreUnavailable` unless the store answers within its time bound."""
        ...

    async def flush(self) -> None:
        """Send the endings (and cancellations) the store queued; raise
        `QuotaStoreUnavailable` if it cannot (they stay queued)."""
        ...

    def pending(self) -> int:
        """Endings and cancellations queued in the store, not yet confirmed delivered."""
        ...


class GuardedQuotaStore:
    """A `QuotaStore`: the shared store, with the policy for when it cannot answer."""

    def __init__(
        self,
        shared: SharedQuotaStore,
        *,
        policy: FailurePolicy = FailurePolicy.CLOSED,
        replicas: int = 1,
        clock: Clock | None = None,
    ) -> None:
        if replicas < 1:
            raise ValueError(f"replicas must be at least 1, got {replicas}")
        self.shared = shared
        self.policy = policy
        self._replicas = replicas
        self._local = InMemoryQuotaStore(clock) if policy is FailurePolicy.LOCAL else None
        self._endings: dict[str, tuple[Lease, LeaseState, int]] = {}
        self.up = True
        """Whether the last call to the shared store was answered."""
        self.errors = 0
        """Calls to the shared store that failed or ran out of time."""

    @property
    def unready_reason(self) -> str | None:
        """Why /readyz fails: while the store is down and the policy refuses requests."""
        return UNAVAILABLE if not self.up and self.policy is FailurePolicy.CLOSED else None

    @property
    def degraded(self) -> bool:
        """Admitting against local counters (the store is down, the policy is `local`)."""
        return not self.up and self.policy is FailurePolicy.LOCAL

    def pending(self) -> int:
        """Endings and cancellations waiting for the shared store to take them."""
        return len(self._endings) + self.shared.pending()

    async def try_reserve(
        self, scopes: Sequence[ScopedLimits], prompt_tokens: int, max_tokens: int, ttl: float
    ) -> tuple[Lease | Refusal, RateLimitStatus]:
        try:
            outcome = await self.shared.try_reserve(scopes, prompt_tokens, max_tokens, ttl)
        except QuotaStoreUnavailable as exc:
            self._failed(exc)  # a reservation in doubt is the shared store's to cancel
            if self._local is None:
                raise
            shares = self._shares(scopes)
            return await self._local.try_reserve(shares, prompt_tokens, max_tokens, ttl)
        self._answered()
        return outcome

    async def finish(self, lease: Lease, state: LeaseState, charged_tokens: int) -> bool:
        if self._local is not None and self._local.holds(lease.lease_id):
            return await self._local.finish(lease, state, charged_tokens)
        if lease.lease_id in self._endings:
            return False  # ended already; the ending is on its way
        try:
            ended = await self.shared.finish(lease, state, charged_tokens)
        except QuotaStoreUnavailable as exc:
            self._failed(exc)
            return self._end_later(lease, state, charged_tokens)
        except asyncio.CancelledError:
            # Cancelled mid-call (shutdown): whether it arrived is unknown; deliver it again.
            self._end_later(lease, state, charged_tokens)
            raise
        # Not `_answered()`: a shared store that queues endings asked nobody anything.
        return ended

    async def renew(self, lease: Lease, ttl: float) -> bool:
        if self._local is not None and self._local.holds(lease.lease_id):
            return await self._local.renew(lease, ttl)
        if lease.lease_id in self._endings:
            return False
        if not self.up:
            # It would only wait out the timeout; upkeep renews again once the store answers,
            # long before the lease's time to live is over.
            return True
        try:
            renewed = await self.shared.renew(lease, ttl)
        except QuotaStoreUnavailable as exc:
            self._failed(exc)
            return True  # still held in the store as far as anyone knows; renewed next round
        self._answered()
        return renewed

    async def reclaim_expired(self) -> int:
        reclaimed = await self._local.reclaim_expired() if self._local is not None else 0
        try:
            reclaimed += await self.shared.reclaim_expired()
        except QuotaStoreUnavailable as exc:
            self._failed(exc)
            return reclaimed
        self._answered()
        return reclaimed

    async def status(self, scopes: Sequence[ScopedLimits]) -> RateLimitStatus:
        try:
            status = await self.shared.status(scopes)
        except QuotaStoreUnavailable as exc:
            self._failed(exc)
            if self._local is not None:
                return await self._local.status(self._shares(scopes))
            return RateLimitStatus()  # nothing true to say
        self._answered()
        return status

    async def usage(self, scope: Scope) -> ScopeUsage:
        return await self.shared.usage(scope)

    def active_leases(self) -> int:
        local = self._local.active_leases() if self._local is not None else 0
        return self.shared.active_leases() + local

    async def check(self) -> bool:
        """Probe the shared store; once it answers, deliver the endings and cancellations
        that waited. True when it answered."""
        try:
            await self.shared.ping()
            await self.shared.flush()
            for lease_id, (lease, state, charged_tokens) in list(self._endings.items()):
                # False too means delivered: it had arrived before its answer was lost, or
                # the lease expired meanwhile and was charged in full. Never twice.
                await self.shared.finish(lease, state, charged_tokens)
                del self._endings[lease_id]
        except QuotaStoreUnavailable as exc:
            self._failed(exc)
            return False
        self._answered()
        return True

    def _shares(self, scopes: Sequence[ScopedLimits]) -> list[ScopedLimits]:
        return [ScopedLimits(scope, share(limits, self._replicas)) for scope, limits in scopes]

    def _end_later(self, lease: Lease, state: LeaseState, charged_tokens: int) -> bool:
        self._endings[lease.lease_id] = (lease, state, charged_tokens)
        # The request is over: what it will be charged is known now (metrics read it).
        lease.state, lease.charged_tokens = state, charged_tokens
        return True

    def _failed(self, exc: QuotaStoreUnavailable) -> None:
        self.errors += 1
        if self.up:
            logger.warning("%s; failure policy %s applies until it answers", exc, self.policy)
        self.up = False

    def _answered(self) -> None:
        if not self.up:
            logger.warning("quota store answers again")
        self.up = True


def share(limits: Limits, replicas: int) -> Limits:
    """One replica's share of `limits` while it counts alone: each count divided by the
    replicas, rounded down (max_tokens is per request, so it stays)."""
    if replicas == 1:
        return limits

    def part(value: int | None) -> int | None:
        return None if value is None else value // replicas

    return Limits(
        rpm=part(limits.rpm),
        tpm=part(limits.tpm),
        tokens_per_day=part(limits.tokens_per_day),
        tokens_per_month=part(limits.tokens_per_month),
        max_concurrency=part(limits.max_concurrency),
        max_tokens=limits.max_tokens,
    )
