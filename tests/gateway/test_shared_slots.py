"""Replicas sharing the engines' slots through a real Redis (serving/gateway/shared_slots.py):
two fair queues, each with its own `SharedSlots`, as two gateway replicas would have."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from serving.gateway.fair_queue import FairQueue, Turn
from serving.gateway.quota.redis_client import RedisClient
from serving.gateway.shared_slots import TTL_INTERVALS, SharedSlots
from tests.gateway.quota.redis_server import RedisServer
from tests.gateway.servers import closed_port

INTERVAL_S = 0.05


def replica(url: str, name: str, slots: int = 16) -> tuple[FairQueue, SharedSlots]:
    queue = FairQueue(slots, reserved=1, timeout_s=5)
    client = RedisClient.from_url(url, timeout_s=1)
    return queue, SharedSlots(client, queue, interval_s=INTERVAL_S, replicas=2, replica=name)


async def rounds(*replicas: SharedSlots, count: int = 3) -> None:
    for _ in range(count):
        for shared in replicas:
            await shared.sync()


async def stop(tasks: list[asyncio.Task[Turn]], *replicas: SharedSlots) -> None:
    """The requests still running or waiting cancelled, the replicas' clients closed."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for shared in replicas:
        await shared.close()


async def until(check: Callable[[], bool], step: Callable[[], Awaitable[None]]) -> None:
    deadline = time.monotonic() + 10
    while not check():
        assert time.monotonic() < deadline, "not within 10 s"
        await step()
        await asyncio.sleep(INTERVAL_S)


def test_a_flood_through_one_replica_leaves_a_quiet_key_a_slot_on_the_other(
    redis_server: RedisServer,
) -> None:
    redis_server.flush()

    async def scenario() -> None:
        (flooded, a), (quiet_side, b) = (
            replica(redis_server.url, "a"),
            replica(redis_server.url, "b"),
        )
        await rounds(a, b)
        noisy: list[asyncio.Task[Turn]] = [
            asyncio.create_task(flooded.turn("noisy", cost=100)) for _ in range(40)
        ]
        await asyncio.sleep(0)
        await rounds(a, b)
        # The flood holds all but the reserved slots, on its replica; none beyond the engine's.
        assert flooded.running == 14 and flooded.slots == 15
        assert quiet_side.slots == 1 and a.claim + b.claim <= 16
        quiet = await asyncio.wait_for(quiet_side.turn("quiet", cost=10), 1)  # at once
        assert quiet.waited_s == 0.0
        # The same key through the other replica is held to its share there too.
        other = asyncio.create_task(quiet_side.turn("noisy", cost=100))
        await rounds(a, b)
        assert not other.done() and flooded.running + quiet_side.running <= 16
        quiet_side.release(quiet)
        await stop([*noisy, other], a, b)

    asyncio.run(scenario())


def test_a_replica_that_stops_reporting_is_forgotten_and_its_slots_go_to_the_others(
    redis_server: RedisServer,
) -> None:
    redis_server.flush()

    async def scenario() -> None:
        (gone_queue, gone), (kept_queue, kept) = (
            replica(redis_server.url, "gone"),
            replica(redis_server.url, "kept"),
        )
        await rounds(gone, kept)  # as a gateway's lifespan does before traffic
        flood = [asyncio.create_task(gone_queue.turn("a", cost=1)) for _ in range(40)]
        waiting = [asyncio.create_task(kept_queue.turn("b", cost=1)) for _ in range(40)]
        await asyncio.sleep(0)
        await rounds(gone, kept)
        assert gone.claim + kept.claim <= 16 and gone.claim >= 7
        silent_since = time.monotonic()  # "gone" reports no more, its requests still held
        await until(lambda: kept.claim >= 15, kept.sync)
        forgotten_after = time.monotonic() - silent_since
        assert forgotten_after >= INTERVAL_S * TTL_INTERVALS * 0.9, forgotten_after
        assert kept_queue.running == 15  # b's share of every slot but the reserved one
        await stop([*flood, *waiting], gone, kept)

    asyncio.run(scenario())


def test_redis_away_leaves_each_replica_its_own_part_until_it_answers(
    own_redis: RedisServer,
) -> None:
    async def scenario() -> None:
        queue, shared = replica(own_redis.url, "alone")
        await shared.sync()
        assert shared.up and queue.slots == 1  # nothing asked yet: the reserved slot
        own_redis.pause()
        try:
            await shared.sync()  # times out
            assert not shared.up and shared.errors == 1
            assert queue.slots == 8  # 16 slots over --redis-replicas 2, its own rules
            assert queue.try_turn("a", cost=1) is not None
        finally:
            own_redis.resume()
        await shared.sync()
        await shared.sync()
        assert shared.up and queue.slots == 2  # a's share (its one request) and the reserved one
        await shared.close()

    asyncio.run(scenario())


def test_an_unreachable_redis_from_the_start_is_the_same() -> None:
    async def scenario() -> None:
        queue, shared = replica(f"redis://127.0.0.1:{closed_port()}/0", "alone")
        await shared.sync()
        assert not shared.up and queue.slots == 8
        await shared.close()

    asyncio.run(scenario())
