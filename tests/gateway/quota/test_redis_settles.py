"""The Redis store's queued settles, on a real redis-server: a settle rides on the next call
(one round trip a request, counted by Redis's own commandstats) and frees its slot for that
call; another replica gets the slot back once the settle delay ran out; a settle survives
Redis being away and lands once, when it is back; shutdown sends what is queued and cancels
a reservation it cut off; upkeep reclaims many key ids in few calls.

The engine-level rules over both stores are `test_state_machine`'s.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from serving.gateway.quota import (
    Lease,
    LeaseState,
    Limits,
    ManualClock,
    QuotaStoreUnavailable,
    Refusal,
    Scope,
    ScopedLimits,
)
from serving.gateway.quota.redis_store import RECLAIM_KEYS_PER_CALL, RedisQuotaStore
from tests.gateway.quota.conftest import SLOW_MACHINE_TIMEOUT_S
from tests.gateway.quota.redis_server import RedisServer
from tests.gateway.quota.running import run_async
from tests.gateway.quota.subjects import utc

pytestmark = pytest.mark.timeout(120)

SCOPE = Scope("k1")
ONE_SLOT = (ScopedLimits(SCOPE, Limits(max_concurrency=1, tpm=10_000)),)
# A settle delay longer than any test: endings go with the next call, never by timer.
NEVER_S = 3600.0
# Generous: only bounds how long a broken test hangs, never waited out.
DEADLINE_S = 30.0


@asynccontextmanager
async def store_on(
    server: RedisServer,
    *,
    settle_delay_s: float = NEVER_S,
    timeout_s: float = SLOW_MACHINE_TIMEOUT_S,
    clock: ManualClock | None = None,
) -> AsyncIterator[RedisQuotaStore]:
    store = RedisQuotaStore.from_url(
        server.url, timeout_s=timeout_s, clock=clock, settle_delay_s=settle_delay_s
    )
    try:
        yield store
    finally:
        await store.close()


@pytest.fixture
def server(redis_server: RedisServer) -> Iterator[RedisServer]:
    redis_server.flush()
    yield redis_server


@pytest.fixture
def persistent_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of the test's own that keeps its data when it is killed."""
    own = RedisServer(tmp_path / "redis", persistent=True)
    own.start()
    yield own
    own.stop()


async def until(check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not check():
        assert time.monotonic() < deadline, "never happened"
        await asyncio.sleep(0.01)


async def reserve(store: RedisQuotaStore, ttl: float = 600) -> Lease | Refusal:
    outcome, _ = await store.try_reserve(ONE_SLOT, 10, 10, ttl)
    return outcome


# What the store sends over the network (commandstats also counts what scripts run inside).
ROUND_TRIPS = ("evalsha", "eval", "smembers", "ping")


def sent(server: RedisServer, before: dict[str, int]) -> dict[str, int]:
    """Round trips the store made since `before`, by command."""
    after = server.commands()
    return {
        name: after[name] - before.get(name, 0)
        for name in ROUND_TRIPS
        if after.get(name, 0) != before.get(name, 0)
    }


@run_async
async def test_a_settle_rides_on_the_next_reservation_which_finds_its_slot_free(
    server: RedisServer,
) -> None:
    async with store_on(server) as store:
        lease = await reserve(store)
        assert isinstance(lease, Lease)
        before = server.commands()
        assert await store.finish(lease, LeaseState.SETTLED, 7)  # queued: nothing sent
        assert sent(server, before) == {}
        assert (lease.state, lease.charged_tokens) == (LeaseState.SETTLED, 7)
        assert store.pending() == store.active_leases() == 1  # its slot is held until sent
        again = await reserve(store)  # one slot: free only if the settle ran first
        assert isinstance(again, Lease)
        assert store.pending() == 0 and store.active_leases() == 1
        for _ in range(20):  # requests one after another: one round trip each
            assert await store.finish(again, LeaseState.SETTLED, 7)
            again = await reserve(store)
            assert isinstance(again, Lease)
        assert sent(server, before) == {"evalsha": 21}
        usage = await store.usage(SCOPE)
        assert (usage.in_flight, usage.requests_in_window) == (1, 22)
        assert usage.tokens_in_window == 21 * 7 + 20  # settled charges, one reservation


@run_async
async def test_another_replica_gets_the_slot_back_once_the_settle_delay_ran_out(
    server: RedisServer,
) -> None:
    async with store_on(server, settle_delay_s=0.01) as quick, store_on(server) as slow:
        lease = await reserve(quick)
        assert isinstance(lease, Lease)
        assert await quick.finish(lease, LeaseState.SETTLED, 1)
        # Nobody calls Redis: after its delay the settle goes by itself ...
        await until(lambda: quick.pending() == 0)
        # ... and another replica finds the slot free.
        held = await reserve(slow)
        assert isinstance(held, Lease)
        # A replica whose delay has not run out (an hour here) has sent nothing: the slot
        # stays taken for the others, but not for itself (its settle runs first).
        assert await slow.finish(held, LeaseState.SETTLED, 1)
        assert isinstance(await reserve(quick), Refusal)
        again = await reserve(slow)
        assert isinstance(again, Lease)
        assert await slow.finish(again, LeaseState.SETTLED, 1)
        await slow.flush()  # what the lease upkeep does on every replica
        assert isinstance(await reserve(quick), Lease)
        usage = await slow.usage(SCOPE)
        assert (usage.in_flight, usage.requests_in_window) == (1, 4)


@run_async
async def test_a_settle_queued_while_redis_is_down_lands_once_after_it_is_back(
    persistent_redis: RedisServer,
) -> None:
    async with store_on(persistent_redis, settle_delay_s=0.01, timeout_s=0.5) as store:
        lease = await reserve(store)
        assert isinstance(lease, Lease)
        persistent_redis.kill()
        assert await store.finish(lease, LeaseState.ABORTED, 3)
        with pytest.raises(QuotaStoreUnavailable):
            await store.flush()
        assert store.pending() == store.active_leases() == 1  # kept for later
        persistent_redis.start()  # with its data: the lease is still held there
        # No call is made: the queue's own retry delivers it.
        await until(lambda: store.pending() == 0)
        usage = await store.usage(SCOPE)
        assert (usage.in_flight, usage.tokens_in_window, usage.tokens_today) == (0, 3, 3)
        assert store.active_leases() == 0
        assert lease.state is LeaseState.ABORTED


@run_async
async def test_a_settle_sent_twice_into_a_black_hole_is_charged_once(
    own_redis: RedisServer,
) -> None:
    async with store_on(own_redis, settle_delay_s=0.01, timeout_s=0.3) as store:
        lease = await reserve(store)
        assert isinstance(lease, Lease)
        own_redis.pause()
        try:
            assert await store.finish(lease, LeaseState.SETTLED, 5)
            for _ in range(2):  # sent, never answered: it may run when Redis wakes
                with pytest.raises(QuotaStoreUnavailable):
                    await store.flush()
            assert store.pending() == 1
        finally:
            own_redis.resume()
        await until(lambda: store.pending() == 0)
        usage = await store.usage(SCOPE)
        assert (usage.in_flight, usage.tokens_in_window, usage.tokens_today) == (0, 5, 5)


@run_async
async def test_closing_sends_the_queued_settles(server: RedisServer) -> None:
    async with store_on(server) as witness:
        async with store_on(server) as closing:
            lease = await reserve(closing)
            assert isinstance(lease, Lease)
            assert await closing.finish(lease, LeaseState.SETTLED, 4)
            assert (await witness.usage(SCOPE)).in_flight == 1
        usage = await witness.usage(SCOPE)
        assert (usage.in_flight, usage.tokens_in_window) == (0, 4)


@run_async
async def test_a_reservation_cut_off_by_shutdown_is_cancelled_not_left_to_expire(
    own_redis: RedisServer,
) -> None:
    unlimited = (ScopedLimits(SCOPE, Limits()),)
    async with store_on(own_redis) as store:
        first, _ = await store.try_reserve(unlimited, 10, 10, 600)  # scripts loaded
        assert isinstance(first, Lease)
        assert await store.finish(first, LeaseState.SETTLED, 15)
        own_redis.pause()
        try:
            reserving = asyncio.ensure_future(store.try_reserve(unlimited, 10, 10, 600))
            await asyncio.sleep(0.1)  # sent; Redis runs it when it wakes
            reserving.cancel()
            with pytest.raises(asyncio.CancelledError):
                await reserving
            assert store.pending() == 2  # the settle, and the reservation's cancellation
        finally:
            own_redis.resume()
    async with store_on(own_redis) as witness:
        usage = await witness.usage(SCOPE)
        # Booked when Redis woke, then ended by the cancellation at close: no slot held for
        # the 600 s of its lease, no tokens charged; it counts as a request.
        assert (usage.in_flight, usage.requests_in_window, usage.tokens_in_window) == (0, 2, 15)


@run_async
async def test_upkeep_reclaims_many_key_ids_in_a_few_calls(server: RedisServer) -> None:
    clock = ManualClock(monotonic=1000.0, wall=utc(2024, 5, 10, 12))
    key_ids = [f"key-{index}" for index in range(2 * RECLAIM_KEYS_PER_CALL + 10)]
    async with store_on(server, clock=clock) as store:
        for key_id in key_ids:
            lease, _ = await store.try_reserve((ScopedLimits(Scope(key_id), Limits()),), 1, 1, 10)
            assert isinstance(lease, Lease)
        assert await store.reclaim_expired() == 0  # nothing expired yet; script loaded
        clock.advance(10)
        before = server.commands()
        assert await store.reclaim_expired() == len(key_ids)
        # The index once, then three scripts for 138 key ids, sent together.
        assert sent(server, before) == {"smembers": 1, "evalsha": 3}
        assert store.active_leases() == 0


@run_async
async def test_a_settle_that_arrives_after_its_lease_expired_tells_the_lease(
    server: RedisServer,
) -> None:
    clock = ManualClock(monotonic=1000.0, wall=utc(2024, 5, 10, 12))
    async with store_on(server, clock=clock) as late, store_on(server, clock=clock) as upkeep:
        lease = await reserve(late, ttl=10)
        assert isinstance(lease, Lease)
        clock.advance(10)
        assert await upkeep.reclaim_expired() == 1  # another replica's upkeep came first
        # This replica did not see it: it queues the settle (True, as far as it knows) ...
        assert await late.finish(lease, LeaseState.SETTLED, 3)
        await late.flush()
        # ... and Redis, which had charged it in full already, says so. Charged once.
        assert (lease.state, lease.charged_tokens) == (LeaseState.EXPIRED, 20)
        assert late.active_leases() == 0
        assert (await late.usage(SCOPE)).tokens_in_window == 20
