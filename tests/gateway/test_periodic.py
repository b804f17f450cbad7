"""Background jobs: run repeatedly, outlive a failing round, stop cleanly."""

from __future__ import annotations

import asyncio

import pytest

from serving.gateway.periodic import Periodic


async def run_until(job: Periodic, done: asyncio.Event) -> None:
    job.start()
    try:
        await asyncio.wait_for(done.wait(), timeout=20)
    finally:
        await job.stop()


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_failing_round_does_not_stop_the_job(asynchronous: bool) -> None:
    calls: list[int] = []

    async def main() -> None:
        done = asyncio.Event()

        def sync_round() -> None:
            calls.append(1)
            if len(calls) == 1:
                raise RuntimeError("first round fails")
            if len(calls) == 3:
                done.set()

        async def async_round() -> None:
            sync_round()

        job = Periodic("test", async_round if asynchronous else sync_round, interval_s=0.01)
        await run_until(job, done)

    asyncio.run(main())
    assert len(calls) >= 3


def test_stop_before_start_and_twice_is_harmless() -> None:
    async def main() -> None:
        job = Periodic("idle", lambda: None, interval_s=60)
        await job.stop()
        job.start()
        await job.stop()
        await job.stop()

    asyncio.run(main())


def test_a_round_that_returns_seconds_sets_the_next_wait() -> None:
    """Every 0.01 s by the interval, but the round asks for an hour: no second round. (A busy
    machine can only delay rounds, so waiting half a second cannot see one by accident.)"""
    calls: list[int] = []

    async def main() -> None:
        first = asyncio.Event()

        async def round_() -> float:
            calls.append(1)
            first.set()
            return 3600.0

        job = Periodic("ttl", round_, interval_s=0.01)
        job.start()
        try:
            await asyncio.wait_for(first.wait(), timeout=20)
            await asyncio.sleep(0.5)
        finally:
            await job.stop()

    asyncio.run(main())
    assert calls == [1]
