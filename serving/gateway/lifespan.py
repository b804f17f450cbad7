"""The gateway's ASGI lifespan: what starts before the first request and stops after the last.

    lifespan = Lifespan(fleet=..., health=..., ...)   # by `assembly.assemble`, from the parts
    await lifespan.run(receive, send)                 # GatewayApp.__call__, scope "lifespan"

It is handed the parts it starts and stops, and knows nothing else of the app.
Startup, in order: the keys kept in Redis (a failure is not fatal: the refresh rounds keep
trying, and /readyz fails until they load), each engine's client, one health check (the model
list and health before traffic), one round of the runtime adapters (`adapters.sync`; a store
that does not answer is not fatal either), the shared quota store's probe (down is not fatal: its
failure policy holds), the metrics port; then the background jobs start (the Batch API's
runner last). Shutdown stops the jobs (the runner first), closes the engines' clients and
the metrics port, gives lease endings that waited for Redis a last chance, and closes the
stores (off the event loop: draining the budget journal may wait). A startup step that
raises fails the startup with its message.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from serving.gateway.health import HealthMonitor
from serving.gateway.keys.redis_refresh import RedisKeyRefresh
from serving.gateway.keys.redis_store import KeyStoreUnavailable
from serving.gateway.metrics_listener import MetricsListener
from serving.gateway.periodic import Periodic
from serving.gateway.quota.failure_policy import GuardedQuotaStore
from serving.gateway.routing.fleet import Fleet
from serving.gateway.types import Receive, Send

logger = logging.getLogger(__name__)


class BackgroundJob(Protocol):
    """The runtime adapters' sync (`adapters.install.RuntimeAdapters`), as the lifespan runs it."""

    async def first_round(self) -> None: ...

    def start(self) -> None: ...

    async def stop(self) -> None: ...


class Runner(Protocol):
    """The Batch API's runner (`batches.runner.BatchRunner`), as the lifespan runs it."""

    def start(self) -> None: ...

    async def stop(self) -> None: ...


@dataclass(frozen=True, kw_only=True)
class Lifespan:
    fleet: Fleet
    health: HealthMonitor
    adapters: BackgroundJob
    lease_upkeep: Periodic
    slot_sync: Periodic | None
    """The replicas' shared slots (`shared_slots`): a first round before traffic."""
    key_refresh: RedisKeyRefresh | None
    shared_quota: GuardedQuotaStore | None
    metrics_listener: MetricsListener | None
    batch_runner: Runner | None
    """The Batch API's lines (`batches.runner`): started with the other jobs, stopped first."""
    # Run last at shutdown, in this order: the async ones, then the others off the event loop.
    async_closers: Sequence[Callable[[], Awaitable[None]]]
    closers: Sequence[Callable[[], None]]

    async def run(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self._start()
                except Exception as exc:
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self._stop()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _start(self) -> None:
        if self.key_refresh is not None:
            try:
                await self.key_refresh.load()
            except KeyStoreUnavailable as exc:
                logger.warning("%s; /readyz fails until they are loaded", exc)
        await self.fleet.open()
        await self.health.check()
        await self.adapters.first_round()  # the runtime adapters on every engine before traffic
        if self.shared_quota is not None:
            await self.shared_quota.check()
        if self.metrics_listener is not None:
            await self.metrics_listener.start()
        if self.slot_sync is not None:
            await self.slot_sync.run_once()  # this replica's part before its first request
            self.slot_sync.start()
        self.health.start()
        self.fleet.start()
        self.lease_upkeep.start()
        self.adapters.start()
        if self.key_refresh is not None:
            self.key_refresh.start()
        if self.batch_runner is not None:
            self.batch_runner.start()

    async def _stop(self) -> None:
        if self.batch_runner is not None:  # lines cut here run again after a restart
            await self.batch_runner.stop()
        await self.health.stop()
        await self.lease_upkeep.stop()
        if self.slot_sync is not None:
            await self.slot_sync.stop()
        await self.adapters.stop()
        if self.key_refresh is not None:
            await self.key_refresh.stop()
        await self.fleet.close()
        if self.metrics_listener is not None:
            await self.metrics_listener.stop()
        if self.shared_quota is not None:
            await self.shared_quota.check()
        for close_async in self.async_closers:
            await close_async()
        for close in self.closers:
            await asyncio.to_thread(close)
