"""A background job the app runs every few seconds, from lifespan startup to shutdown.

    job = Periodic("lease upkeep", upkeep, interval_s=5)   # `upkeep`: sync or async callable
    job.start() ... await job.stop()

The loop outlives any one failure of the job (it is logged), so one bad round does not stop
health checks or lease upkeep for the rest of the process's life. A job that returns a number
of seconds sets the wait before its next round (engine discovery: its DNS answer's TTL);
otherwise, and after a failure, the next round comes `interval_s` later.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Awaitable, Callable

logger = logging.getLogger(__name__)

Job = Callable[[], Awaitable[object] | object]


class Periodic:
    def __init__(self, name: str, job: Job, *, interval_s: float) -> None:
        self._name = name
        self._job = job
        self._interval_s = interval_s
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def run_once(self) -> None:
        """One round now (its failure logged, as in the loop)."""
        await self._round()

    async def _run(self) -> None:
        delay = self._interval_s
        while True:
            await asyncio.sleep(delay)
            delay = await self._round()

    async def _round(self) -> float:
        """Run the job once; the wait before the next round."""
        try:
            result = self._job()
            if inspect.isawaitable(result):
                result = await result
            if isinstance(result, float):
                return result
        except Exception:  # the loop must outlive any one failure; it is logged
            logger.exception("background job %r failed", self._name)
        return self._interval_s
