"""Fair sharing across gateway replicas on one Redis, on the real engine (docs/fair-sharing.md,
across gateway replicas).

Two `serving gateway` replicas in front of the session's engine share its 16 slots through a
Redis of the module's own (`--redis-url`). A key flooding the engine through one replica
leaves a quiet key a slot on the other at once, and the replicas together never send vLLM
more sequences than its slots (nothing waits in its first-come queue); the same key through
both replicas holds one key's share, not one per replica.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path

import pytest

from serving.gateway.setting_names import flag_name
from serving.gateway.shared_slots import TTL_INTERVALS
from serving.profiles import load_profile
from serving.stack_engines import gateway_engine_settings
from tests.gateway.quota.redis_server import RedisServer
from tests.integration.conftest import Stack, eventually, scrape, total
from tests.integration.test_fair_sharing import (
    MEDIAN_GOAL,
    STALL_BOUND_S,
    OwnGateway,
    flood,
    own_gateway,
    ttfts,
)
from tests.integration.test_gateway_quota import create_key, idle

pytestmark = pytest.mark.redis

# What `serving up` tells its gateway of the session's engine (cpu-tiny, its default): the
# slots, and the tokens per stream event (an event per token costs vLLM's API server 8x the
# work under a flood, and every quiet request waits on it).
ENGINE_SETTINGS = gateway_engine_settings(load_profile("cpu-tiny"), "fair")
SLOTS = int(ENGINE_SETTINGS["engine_slots"])
QUIET_REQUESTS = 8
ENGINE_FLAGS = [
    part for name, value in ENGINE_SETTINGS.items() for part in (flag_name(name), str(value))
]
SYNC_S = 0.1  # the replicas' reports to Redis, twice as often as the default: a faster test


def replica(
    stack: Stack, redis: RedisServer, workdir: Path, *, counted: bool = True
) -> AbstractContextManager[OwnGateway]:
    """A gateway replica on the stack's engine, sharing its slots through `redis`."""
    return own_gateway(
        stack, workdir, *ENGINE_FLAGS, "--reserved-slots", "1", "--redis-url", redis.url,
        "--redis-replicas", "2", "--slot-sync-interval-s", str(SYNC_S), counted=counted,
    )  # fmt: skip


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("fair-redis"))
    server.start()
    yield server
    server.stop()


def slots_of(url: str) -> float:
    return total(scrape(url), "gateway_queue_slots")


def running_of(url: str) -> float:
    return total(scrape(url), "gateway_queue_running")


@pytest.mark.parametrize("noisy_on_both", [False, True], ids=["flood-on-one", "flood-on-both"])
def test_a_flood_through_one_replica_leaves_a_quiet_key_a_slot_on_the_other(
    stack: Stack, redis: RedisServer, tmp_path: Path, noisy_on_both: bool
) -> None:
    noisy_id, noisy = create_key(stack, f"replicas-noisy-{noisy_on_both}")
    quiet_id, quiet = create_key(stack, f"replicas-quiet-{noisy_on_both}")
    with ExitStack() as stack_of:
        a, a_metrics, _ = stack_of.enter_context(replica(stack, redis, tmp_path))
        b, b_metrics, _ = stack_of.enter_context(replica(stack, redis, tmp_path))
        alone = statistics.median(ttfts(b, quiet, QUIET_REQUESTS))
        with ExitStack() as floods:
            floods.enter_context(flood(a, noisy, 32))
            if noisy_on_both:
                floods.enter_context(flood(b, noisy, 8))
            # The flood holds every slot its key may have, across both replicas.
            eventually(
                lambda: total(scrape(stack.engine_url), "vllm:num_requests_running") >= SLOTS - 2,
                budget_s=120,
            )
            eventually(
                lambda: total(scrape(a_metrics), "gateway_queue_waiting", key=noisy_id) > 0,
                budget_s=120,
            )
            # A flood started on both replicas at once may run more than its share on one
            # until the other's report arrives, and nothing is preempted: the steady state
            # is the replica's reserved slot free again (docs/fair-sharing.md).
            eventually(lambda: running_of(b) < slots_of(b), budget_s=60)
            flooded = ttfts(b, quiet, QUIET_REQUESTS)
            waits = scrape(b_metrics)
            engine = scrape(stack.engine_url)
            # Both replicas' parts within the engine's slots; none of it in vLLM's queue.
            assert slots_of(a) + slots_of(b) <= SLOTS
            assert total(engine, "vllm:num_requests_waiting") == 0
            assert total(engine, "vllm:num_requests_running") <= SLOTS
            assert total(scrape(a), "gateway_queue_shared_up") == 1
        median, worst = statistics.median(flooded), max(flooded)
        print(
            f"noisy on {'both replicas' if noisy_on_both else 'one replica'}: quiet TTFT median "
            f"{median * 1000:.0f} ms ({median / alone:.2f}x alone, {alone * 1000:.0f} ms), "
            f"worst {worst * 1000:.0f} ms ({worst / alone:.2f}x)"
        )
        # The quiet key never waited in its replica's queue for a flood's stream to end (each
        # lasts seconds): its one request runs in the replica's reserved slot and moves no
        # share, so no replica is left above a share that shrank (as on one gateway, a few ms
        # at most while its previous request's slot is let go).
        count = total(waits, "gateway_queue_wait_seconds_count", key=quiet_id)
        assert total(waits, "gateway_queue_wait_seconds_bucket", key=quiet_id, le="0.1") == count
        assert median <= MEDIAN_GOAL * alone, (alone, flooded)
        assert worst < STALL_BOUND_S, (alone, flooded)
        eventually(lambda: idle(stack), budget_s=120)


@pytest.mark.oracle_exempt  # a replica is killed: its last charges die with it
def test_a_killed_replicas_slots_go_to_the_other_once_it_has_been_silent(
    stack: Stack, redis: RedisServer, tmp_path: Path
) -> None:
    """A key floods through both replicas and one is killed: the survivor takes the flood's
    whole share once the dead one's claim expires (20 report intervals), not before, and a
    quiet key still finds its slot there."""
    _, noisy = create_key(stack, "replicas-killed-noisy")
    _, quiet = create_key(stack, "replicas-killed-quiet")
    with ExitStack() as stack_of:
        killed = stack_of.enter_context(replica(stack, redis, tmp_path, counted=False))
        survivor, _, _ = stack_of.enter_context(replica(stack, redis, tmp_path, counted=False))
        alone = statistics.median(ttfts(survivor, quiet, QUIET_REQUESTS))
        with flood(killed.url, noisy, 16, cut_off=True), flood(survivor, noisy, 16):
            eventually(lambda: 0 < slots_of(survivor) < SLOTS - 2, budget_s=120)
            eventually(lambda: running_of(survivor) < slots_of(survivor), budget_s=60)
            killed.process.kill()
            killed_at = time.monotonic()
            # Every slot but the reserved one comes to the survivor's flood.
            eventually(lambda: slots_of(survivor) == SLOTS, budget_s=60)
            took = time.monotonic() - killed_at
            eventually(lambda: running_of(survivor) < slots_of(survivor), budget_s=60)
            flooded = ttfts(survivor, quiet, QUIET_REQUESTS)
        print(f"the killed replica's slots came back after {took:.1f} s")
        assert took >= TTL_INTERVALS * SYNC_S * 0.8, took
        assert statistics.median(flooded) <= MEDIAN_GOAL * alone, (alone, flooded)
        assert max(flooded) < STALL_BOUND_S, (alone, flooded)
        eventually(lambda: idle(stack), budget_s=120)
