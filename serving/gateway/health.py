"""What the gateway knows about its engines' health, refreshed in the background.

    monitor = HealthMonitor(router, catalog, metrics, interval_s=5)
    await monitor.check()      # at startup: health, the gauges and the model list
    monitor.start() ... await monitor.stop()
    monitor.unready_reason     # None when an engine is in rotation: what /readyz serves

Every `interval_s` the monitor probes every engine's `/health` at once, tells the router
(an engine failing it leaves the rotation, one passing it comes back; see `Router.probed` for
probes that time out), and refreshes the `ModelCatalog` from every healthy engine's
`/v1/models` (adapters may be on some engines only; an engine that fails keeps its last
list, and is not chosen while out of the rotation anyway). `/readyz` answers from the last
check and never calls an engine itself: an unauthenticated endpoint must not let anyone
multiply the load on the engines.
"""

from __future__ import annotations

import asyncio

from serving.gateway.catalog import ModelCatalog
from serving.gateway.metrics import GatewayMetrics
from serving.gateway.periodic import Periodic
from serving.gateway.routing import Router
from serving.gateway.routing.router import NOT_CHECKED

__all__ = ["NOT_CHECKED", "HealthMonitor"]


class HealthMonitor:
    def __init__(
        self,
        router: Router,
        catalog: ModelCatalog,
        metrics: GatewayMetrics,
        *,
        interval_s: float,
    ) -> None:
        self._router = router
        self._catalog = catalog
        self._metrics = metrics
        self._job = Periodic("upstream health check", self.check, interval_s=interval_s)

    @property
    def unready_reason(self) -> str | None:
        """Why no engine is in the rotation; None while one is."""
        return self._router.unready_reason

    async def check(self) -> None:
        """Probe every engine and, from a healthy one, refresh the model list."""
        engines = self._router.engines
        probes = await asyncio.gather(*(engine.client.probe_health() for engine in engines))
        for engine, probe in zip(engines, probes, strict=True):
            self._router.probed(engine, probe.reason, timed_out=probe.timed_out)
        self._metrics.set_upstream_healthy(self._router.unready_reason is None)
        healthy = [e for e, probe in zip(engines, probes, strict=True) if probe.reason is None]
        lists = await asyncio.gather(*(engine.client.fetch_models() for engine in healthy))
        for engine, models in zip(healthy, lists, strict=True):
            if models is not None:
                self._catalog.update(engine.index, models)

    def start(self) -> None:
        self._job.start()

    async def stop(self) -> None:
        await self._job.stop()
