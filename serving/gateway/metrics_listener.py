"""Every series of `/metrics` on a port of its own (`--metrics-port`), the API port's having
the aggregate ones only.

    listener = MetricsListener(metrics.render, host="0.0.0.0", port=9100)
    await listener.start()      # at lifespan startup, in the serving event loop
    await listener.stop()       # at shutdown

The per-key series name every key id with its spend, rejections and queue waits: fine for
Prometheus, not for every API client, so only this port serves them (`serving up` opens it
by default: `serving.ports.GATEWAY_METRICS_PORT`), and a NetworkPolicy can admit only
Prometheus to it (the overlays' does). It runs in the serving event loop (aiohttp's server),
because the values it renders are updated there without locks.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from serving.gateway.metrics import CONTENT_TYPE


class MetricsListener:
    def __init__(self, render: Callable[[], bytes], *, host: str, port: int) -> None:
        self._render = render
        self._host = host
        self._port = port
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, self._host, self._port).start()
        self._runner = runner

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def _metrics(self, request: web.Request) -> web.Response:
        content_type = CONTENT_TYPE.decode("latin-1")
        return web.Response(body=self._render(), headers={"Content-Type": content_type})
