"""The gateway's ASGI lifespan: what starts before the first request and stops after the last.

    await run_lifespan(app, receive, send)      # GatewayApp.__call__ for scope type "lifespan"

Startup, in order: the keys kept in Redis (a failure is not fatal: the refresh rounds keep
trying, and /readyz fails until they load), each engine's client, one health check (the model
list and health before traffic), one round of the runtime adapters (`adapters.sync`; a store
that does not answer is not fatal either), the shared quota store's probe (down is not fatal: its
failure policy holds), the metrics port; then the background jobs start. Shutdown stops the
jobs, closes the engines' clients and the metrics port, gives lease endings that waited for
Redis a last chance, and closes the stores (off the event loop: draining the budget journal
may wait). A startup step that raises fails the startup with its message.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from serving.gateway.keys.redis_store import KeyStoreUnavailable
from serving.gateway.types import Receive, Send

if TYPE_CHECKING:
    from serving.gateway.app import GatewayApp

logger = logging.getLogger(__name__)


async def run_lifespan(app: GatewayApp, receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            try:
                await _start(app)
            except Exception as exc:
                await send({"type": "lifespan.startup.failed", "message": str(exc)})
                return
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await _stop(app)
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _start(app: GatewayApp) -> None:
    if app.key_refresh is not None:
        try:
            await app.key_refresh.load()
        except KeyStoreUnavailable as exc:
            logger.warning("%s; /readyz fails until they are loaded", exc)
    await app.fleet.open()
    await app.health.check()
    await app.adapters.first_round()  # the runtime adapters on every engine before traffic
    if app.shared_quota is not None:
        await app.shared_quota.check()
    if app.metrics_listener is not None:
        await app.metrics_listener.start()
    app.health.start()
    app.fleet.start()
    app.lease_upkeep.start()
    app.adapters.start()
    if app.key_refresh is not None:
        app.key_refresh.start()


async def _stop(app: GatewayApp) -> None:
    await app.health.stop()
    await app.lease_upkeep.stop()
    await app.adapters.stop()
    if app.key_refresh is not None:
        await app.key_refresh.stop()
    await app.fleet.close()
    if app.metrics_listener is not None:
        await app.metrics_listener.stop()
    if app.shared_quota is not None:
        await app.shared_quota.check()
    for close_async in app.async_closers:
        await close_async()
    for close in app.closers:
        await asyncio.to_thread(close)
