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
