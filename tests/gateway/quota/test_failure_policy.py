"""The Redis store's failure policy against a real redis-server that is paused (SIGSTOP: a
black hole), killed and started again: every call answers within the time bound with the
policy's answer, the state shows it, and once Redis is back the counters add up (endings
delivered by id, nothing charged twice, nothing left held).

Times are bounded, not measured: a call must return well before redis-py's own 5 s socket
timeout would, let alone a hang, with room for a busy machine.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import TypeVar

import pytest

from serving.gateway.quota import (
    Lease,
    LeaseState,
    Limits,
    QuotaStoreUnavailable,
    RateLimitStatus,
    Refusal,
    RefusalReason,
    Scope,
    ScopedLimits,
)
from serving.gateway.quota.failure_policy import FailurePolicy, GuardedQuotaStore, share
from serving.gateway.quota.redis_store import RedisQuotaStore
from tests.gateway.quota.redis_server import RedisServer
from tests.gateway.quota.running import run_async

pytestmark = pytest.mark.timeout(120)

T = TypeVar("T")

TIMEOUT_S = 0.5
BOUND_S = TIMEOUT_S + 3.0
# Generous: only bounds how long a broken test hangs, never waited out.
DEADLINE_S = 60.0
SCOPE = Scope("k1")
LIMITS = (ScopedLimits(SCOPE, Limits(rpm=10, max_concurrency=5)),)


async def bounded(call: Awaitable[T]) -> T:
    """`await call`, asserting it answered within the bound."""
    started = time.monotonic()
    try:
        return await call
    finally:
        assert time.monotonic() - started < BOUND_S


async def back(guard: GuardedQuotaStore) -> None:
    """Wait until the store answers again and what waited has been delivered (an ending
    the store's own retry is carrying when `check` runs arrives with that call)."""
    deadline = time.monotonic() + DEADLINE_S
    while not await guard.check() or guard.pending():
        assert time.monotonic() < deadline, "the quota store never took what waited"
        await asyncio.sleep(0.05)
    assert guard.up


def guarded(server: RedisServer, policy: FailurePolicy, replicas: int = 1) -> GuardedQuotaStore:
    shared = RedisQuotaStore.from_url(server.url, timeout_s=TIMEOUT_S)
    return GuardedQuotaStore(shared, policy=policy, replicas=replicas)


@run_async
async def test_closed_refuses_in_time_while_redis_is_black_holed_and_settles_after(
    own_redis: RedisServer,
) -> None:
    guard = guarded(own_redis, FailurePolicy.CLOSED)
    shared = guard.shared
    assert isinstance(shared, RedisQuotaStore)
    try:
        lease, _ = await guard.try_reserve(LIMITS, 10, 10, 600)
        assert isinstance(lease, Lease) and guard.up and guard.unready_reason is None
        own_redis.pause()
        with pytest.raises(QuotaStoreUnavailable):
            await bounded(guard.try_reserve(LIMITS, 10, 10, 600))
        assert not guard.up and guard.errors == 1
        assert guard.unready_reason == "quota store unavailable" and not guard.degraded
        # The request ends meanwhile: its ending waits, the lease keeps its slot in Redis.
        assert await bounded(guard.finish(lease, LeaseState.SETTLED, 7))
        assert (lease.state, lease.charged_tokens) == (LeaseState.SETTLED, 7)
        assert not await guard.finish(lease, LeaseState.SETTLED, 7)  # once
        assert await bounded(guard.status(LIMITS)) == RateLimitStatus()  # no headers
        assert not await bounded(guard.check())
        assert guard.pending() == 2  # the ending, and the reservation in doubt
        assert guard.active_leases() == 1
        own_redis.resume()
        await back(guard)
        # The paused server ran what was buffered when it woke (the ending among it); the
        # ending delivered again changed nothing: charged once, nothing held.
        usage = await guard.usage(SCOPE)
        assert usage.in_flight == 0 and guard.active_leases() == 0
        assert usage.tokens_in_window == usage.tokens_today == 7
        assert usage.requests_in_window in (1, 2)  # the one in doubt, if it had arrived
    finally:
        own_redis.resume()
        await shared.close()


@run_async
async def test_closed_refuses_at_once_while_redis_is_gone_and_recovers_when_it_returns(
    own_redis: RedisServer,
) -> None:
    guard = guarded(own_redis, FailurePolicy.CLOSED)
    shared = guard.shared
    assert isinstance(shared, RedisQuotaStore)
    try:
        lease, _ = await guard.try_reserve(LIMITS, 10, 10, 600)
        assert isinstance(lease, Lease)
        own_redis.kill()
        with pytest.raises(QuotaStoreUnavailable):
            await bounded(guard.try_reserve(LIMITS, 10, 10, 600))
        assert await bounded(guard.renew(lease, 600))  # held, as far as anyone knows
        assert await bounded(guard.reclaim_expired()) == 0
        assert await bounded(guard.finish(lease, LeaseState.ABORTED, 3))
        assert guard.unready_reason is not None
        own_redis.start()  # empty: this server kept nothing on disk
        await back(guard)
        assert guard.active_leases() == 0
        admitted, _ = await guard.try_reserve(LIMITS, 10, 10, 600)
        assert isinstance(admitted, Lease)
        assert (await guard.usage(SCOPE)).in_flight == 1
    finally:
        await shared.close()


@run_async
async def test_local_admits_a_replicas_share_of_each_limit_while_redis_is_away(
    own_redis: RedisServer,
) -> None:
    guard = guarded(own_redis, FailurePolicy.LOCAL, replicas=3)
    shared = guard.shared
    assert isinstance(shared, RedisQuotaStore)
    try:
        limits = (ScopedLimits(SCOPE, Limits(rpm=10)),)
        own_redis.pause()
        outcomes = [await bounded(guard.try_reserve(limits, 1, 1, 600)) for _ in range(4)]
        leases = [outcome for outcome, _ in outcomes if isinstance(outcome, Lease)]
        refusal = outcomes[-1][0]
        assert len(leases) == 3  # rpm 10 over 3 replicas
        assert isinstance(refusal, Refusal) and refusal.reason is RefusalReason.RPM
        assert refusal.limit == 3
        assert guard.degraded and guard.unready_reason is None
        assert [await guard.finish(lease, LeaseState.SETTLED, 2) for lease in leases] == [True] * 3
        # Local leases end locally; what waits is cancelling the four reservations sent to
        # Redis, which it may run when it wakes.
        assert guard.pending() == 4
        status = await bounded(guard.status(limits))
        assert status.requests is not None and status.requests.limit == 3
        own_redis.resume()
        await back(guard)
        lease, status = await guard.try_reserve(limits, 1, 1, 600)
        assert isinstance(lease, Lease) and status.requests is not None
        assert status.requests.limit == 10  # Redis decides again
        assert guard.active_leases() == 1
    finally:
        own_redis.resume()
        await shared.close()


def test_a_replicas_share_rounds_down_and_keeps_the_per_request_cap() -> None:
    limits = Limits(rpm=10, tpm=1000, tokens_per_day=5, max_concurrency=2, max_tokens=64)
    assert share(limits, 3) == Limits(
        rpm=3, tpm=333, tokens_per_day=1, max_concurrency=0, max_tokens=64
    )
    assert share(limits, 1) is limits
