"""The Redis store's own contract, below the engine, on a real redis-server: leases known by
id across store objects, idempotent endings, a crashed replica's leases expiring, the
scripts' calendar, reloading scripts, and exactness when processes race.

The engine-level rules are held against a model by `test_state_machine`, over this store
and the in-memory one alike.
"""

from __future__ import annotations

import asyncio
import calendar
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from importlib import resources
from pathlib import Path

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.gateway.quota import (
    Lease,
    LeaseState,
    Limits,
    ManualClock,
    Refusal,
    RefusalReason,
    Scope,
    ScopedLimits,
    redis_store,
)
from serving.gateway.quota.redis_store import DEFAULT_SETTLE_DELAY_S, RedisQuotaStore
from serving.gateway.quota.store import QuotaStoreUnavailable
from serving.gateway.quota.windows import utc_day, utc_month
from tests.gateway.conftest import eventually
from tests.gateway.quota.conftest import SLOW_MACHINE_TIMEOUT_S
from tests.gateway.quota.redis_server import RedisServer
from tests.gateway.quota.running import run_async
from tests.gateway.quota.subjects import utc

pytestmark = pytest.mark.timeout(300)

SCOPE = Scope("k1")
ONE_SLOT = (ScopedLimits(SCOPE, Limits(max_concurrency=1, tpm=1000)),)
# Generous: these only bound how long a broken test hangs, they are never waited out.
DEADLINE_S = 60.0
# Longer than any test: a settle delay that never runs out.
LONG_S = 3600.0
ROOT = Path(__file__).resolve().parents[3]

Stores = Callable[..., RedisQuotaStore]


@asynccontextmanager
async def stores(server: RedisServer) -> AsyncIterator[Stores]:
    """Fresh store objects on one emptied Redis, as separate replicas would hold them."""
    server.flush()
    async with AsyncExitStack() as stack:

        def make(
            clock: ManualClock | None = None, settle_delay_s: float = DEFAULT_SETTLE_DELAY_S
        ) -> RedisQuotaStore:
            store = RedisQuotaStore.from_url(
                server.url,
                clock=clock,
                timeout_s=SLOW_MACHINE_TIMEOUT_S,
                settle_delay_s=settle_delay_s,
            )
            stack.push_async_callback(store.close)
            return store

        yield make


async def reserve(store: RedisQuotaStore, ttl: float = 60) -> Lease | Refusal:
    outcome, _ = await store.try_reserve(ONE_SLOT, 10, 10, ttl)
    return outcome


def copy_of(lease: Lease) -> Lease:
    """The same lease as another object (e.g. rebuilt from its id by another replica)."""
    return Lease(
        lease.lease_id, lease.scopes, lease.prompt_estimate, lease.max_tokens,
        lease.bucket, lease.day, lease.month, lease.expires_at,
    )  # fmt: skip


@run_async
async def test_a_lease_ends_once_by_id_whichever_replica_ends_it(
    redis_server: RedisServer,
) -> None:
    async with stores(redis_server) as make:
        # No flush by timer in this test: endings go with the next call.
        first, second = make(settle_delay_s=LONG_S), make(settle_delay_s=LONG_S)
        lease = await reserve(first)
        assert isinstance(lease, Lease)
        assert isinstance(await reserve(second), Refusal)  # one slot, shared
        assert await second.finish(copy_of(lease), LeaseState.SETTLED, 7)
        # The replica that issued it did not see it end: it queues its own ending (True:
        # as far as it knows), which Redis drops. A settle never charges twice.
        assert await first.finish(lease, LeaseState.SETTLED, 7)
        assert not await first.finish(lease, LeaseState.SETTLED, 7)  # queued already
        assert not await second.finish(copy_of(lease), LeaseState.ABORTED, 100)
        assert first.active_leases() == first.pending() == 1  # until Redis has it
        await first.flush()
        usage = await first.usage(SCOPE)
        assert (usage.in_flight, usage.requests_in_window, usage.tokens_in_window) == (0, 1, 7)
        assert (usage.tokens_today, usage.tokens_this_month) == (7, 7)
        assert first.active_leases() == second.active_leases() == 0
        with pytest.raises(ValueError, match="not an ending"):
            await first.finish(lease, LeaseState.ACTIVE, 1)


@run_async
async def test_a_crashed_replicas_leases_expire_with_their_reservation_charged(
    redis_server: RedisServer,
) -> None:
    clock = ManualClock(monotonic=1000.0, wall=utc(2024, 5, 10, 12))
    async with stores(redis_server) as make:
        crashed = make(clock)
        lease = await reserve(crashed, ttl=30)
        assert isinstance(lease, Lease)
        del crashed  # never ends its lease, never renews it
        survivor = make(clock)
        assert isinstance(await reserve(survivor), Refusal)
        clock.advance(29.5)
        assert isinstance(await reserve(survivor), Refusal)
        clock.advance(0.5)
        # The next reservation of the key reclaims it first: the slot is free again.
        again = await reserve(survivor)
        assert isinstance(again, Lease)
        usage = await survivor.usage(SCOPE)
        assert (usage.in_flight, usage.tokens_in_window) == (1, 20 + 20)
        # Ended by id elsewhere: a late settle learns how, and charges nothing more.
        late = copy_of(lease)
        assert not await survivor.finish(late, LeaseState.SETTLED, 1)
        assert (late.state, late.charged_tokens) == (LeaseState.EXPIRED, 20)
        assert not await survivor.renew(copy_of(lease), 30)
        assert (await survivor.usage(SCOPE)).tokens_in_window == 40


@run_async
async def test_upkeep_reclaims_expired_leases_of_every_key_and_tells_their_holder(
    redis_server: RedisServer,
) -> None:
    clock = ManualClock(monotonic=1000.0, wall=utc(2024, 5, 10, 12))
    async with stores(redis_server) as make:
        store = make(clock)
        leases = []
        for key_id in ("k1", "k{2}:x", "k3"):
            lease, _ = await store.try_reserve((ScopedLimits(Scope(key_id), Limits()),), 1, 2, 10)
            assert isinstance(lease, Lease)
            leases.append(lease)
        assert await store.renew(leases[2], 20)
        clock.advance(10)
        assert await store.reclaim_expired() == 2
        assert [lease.state for lease in leases] == [LeaseState.EXPIRED] * 2 + [LeaseState.ACTIVE]
        assert leases[0].charged_tokens == 3
        assert store.active_leases() == 1
        assert (await store.usage(Scope("k{2}:x"))).in_flight == 0
        clock.advance(10)
        assert await make(clock).reclaim_expired() == 1  # any replica's upkeep will do
        assert await store.reclaim_expired() == 0


@run_async
async def test_a_key_and_its_models_are_separate_counters_whatever_their_names(
    redis_server: RedisServer,
) -> None:
    async with stores(redis_server) as make:
        store = make()
        key = Scope("key:{a}")
        scopes = (
            ScopedLimits(key, Limits(rpm=10)),
            ScopedLimits(Scope(key.key_id, "org/model:v1"), Limits(rpm=1)),
        )
        lease, status = await store.try_reserve(scopes, 5, 5, 60)
        assert isinstance(lease, Lease)
        assert status.requests is not None and status.requests.remaining == 0
        refusal, _ = await store.try_reserve(scopes, 5, 5, 60)
        assert isinstance(refusal, Refusal) and refusal.reason is RefusalReason.RPM
        assert refusal.scope == Scope(key.key_id, "org/model:v1")
        other, _ = await store.try_reserve(scopes[:1], 5, 5, 60)
        assert isinstance(other, Lease)
        assert (await store.usage(key)).requests_in_window == 2
        assert (await store.usage(Scope(key.key_id, "other"))).requests_in_window == 0


@run_async
async def test_scripts_are_loaded_again_after_the_server_forgot_them(
    redis_server: RedisServer,
) -> None:
    async with stores(redis_server) as make:
        store = make()
        assert isinstance(await reserve(store), Lease)
        with redis.Redis(port=redis_server.port) as admin:
            admin.script_flush()  # as after a restart: EVALSHA answers NOSCRIPT
        assert isinstance(await reserve(store), Refusal)


def test_the_scripts_calendar_is_pythons(redis_server: RedisServer) -> None:
    common = resources.files("serving.gateway.quota").joinpath("lua/common.lua").read_text()
    with redis.Redis(port=redis_server.port, decode_responses=True) as admin:
        # The wall clock as a script gets it (no endings queued), through its prelude.
        script = admin.register_script(common + "\nreturn {utc_periods(wall)}")
        edges = [utc(2024, 2, 29, 23, 59, 59), utc(2024, 3, 1), utc(1999, 12, 31, 23, 59, 59)]
        edges += [utc(2000, 2, 29, 12), utc(2100, 3, 1), utc(1970, 1, 1), utc(2023, 12, 31, 12)]

        @settings(max_examples=300, deadline=None, database=None)
        @given(st.floats(0, calendar.timegm((2200, 1, 1, 0, 0, 0))) | st.sampled_from(edges))
        def same(wall: float) -> None:
            day, month = script(keys=["qs:{t}:leases"], args=[repr(wall), repr(wall), 0])
            assert (day, month) == (utc_day(wall), utc_month(wall))

        same()


# -- replicas racing: separate processes, each its own RedisQuotaStore -------------------


def race(server: RedisServer, tmp_path: Path, *, key_id: str, limits: Limits, tries: int) -> int:
    """`tries` reservations from each of several processes, released at once; the total
    admitted."""
    processes = 4
    with redis.Redis(port=server.port) as admin:
        admin.delete("race:ready", "race:go")
        racers = []
        for index in range(processes):
            out = (tmp_path / f"racer-{index}.json").open("w")
            command = [sys.executable, "-m", "tests.gateway.quota.racer", server.url, key_id]
            command += [json.dumps(limits.to_mapping()), str(tries)]
            racers.append(subprocess.Popen(command, cwd=ROOT, stdout=out, env=dict(os.environ)))
            out.close()
        assert eventually(lambda: int(admin.get("race:ready") or 0) == processes, DEADLINE_S)
        admin.rpush("race:go", *["go"] * processes)  # all at once
        for racer in racers:
            assert racer.wait(DEADLINE_S) == 0
    return sum(
        json.loads((tmp_path / f"racer-{index}.json").read_text())["admitted"]
        for index in range(processes)
    )


def test_replicas_racing_for_requests_per_minute_admit_exactly_the_limit(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    limit = 37
    admitted = race(redis_server, tmp_path, key_id="race-rpm", limits=Limits(rpm=limit), tries=25)
    assert admitted == limit

    async def counted() -> tuple[int, int]:
        async with stores_without_flush(redis_server.url) as store:
            usage = await store.usage(Scope("race-rpm"))
            return usage.requests_in_window, usage.tokens_in_window

    assert asyncio.run(counted()) == (limit, limit * 3)


def test_replicas_racing_for_concurrency_admit_exactly_the_limit(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    limit = 13
    limits = Limits(max_concurrency=limit, tpm=10**6)
    assert race(redis_server, tmp_path, key_id="race-slots", limits=limits, tries=25) == limit

    async def held() -> int:
        async with stores_without_flush(redis_server.url) as store:
            return (await store.usage(Scope("race-slots"))).in_flight

    assert asyncio.run(held()) == limit  # the racers hold their leases (they never end them)


@asynccontextmanager
async def stores_without_flush(url: str) -> AsyncIterator[RedisQuotaStore]:
    store = RedisQuotaStore.from_url(url, timeout_s=SLOW_MACHINE_TIMEOUT_S)
    try:
        yield store
    finally:
        await store.close()


@run_async
async def test_the_reserve_script_checks_its_bounds_before_its_first_write(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `n: 10**19` once made this script fail half-way (HINCRBY overflowed after the slot
    # was booked), locking the key out. The replica checks first (store.check_reservation);
    # here that check is taken away, so the script's own must hold.
    monkeypatch.setattr(redis_store, "check_reservation", lambda *args: None)
    async with stores(redis_server) as make:
        store = make()
        for prompt, max_tokens in ((10, 10**23), (2**51, 2**51), (-5, 10), (1, 0.5)):
            with pytest.raises(QuotaStoreUnavailable):
                await store.try_reserve(ONE_SLOT, prompt, max_tokens, 60)  # type: ignore[arg-type]
            usage = await store.usage(SCOPE)
            assert (usage.in_flight, usage.requests_in_window, usage.tokens_in_window) == (0, 0, 0)
        assert isinstance(await reserve(store), Lease)  # the one slot is still there
