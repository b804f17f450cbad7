"""What the gateway knows about its upstream's health, refreshed in the background.

    monitor = HealthMonitor(upstream, catalog, metrics, interval_s=5)
    await monitor.check()      # at startup: health, the gauge and the model list
    monitor.start() ... await monitor.stop()
    monitor.unready_reason     # None when healthy: what /readyz serves

Every `interval_s` the monitor re-checks the upstream's `/health` and, when healthy, its
`/v1/models` (into the `ModelCatalog`). `/readyz` answers from the last check and never
calls the upstream itself: an unauthenticated endpoint must not let anyone multiply the
load on the engine.
"""

from __future__ import annotations

from serving.gateway.catalog import ModelCatalog
from serving.gateway.metrics import GatewayMetrics
from serving.gateway.periodic import Periodic
from serving.gateway.upstream import UpstreamClient

NOT_CHECKED = "upstream not checked yet"


class HealthMonitor:
    def __init__(
        self,
        upstream: UpstreamClient,
        catalog: ModelCatalog,
        metrics: GatewayMetrics,
        *,
        interval_s: float,
    ) -> None:
        self._upstream = upstream
        self._catalog = catalog
        self._metrics = metrics
        self._job = Periodic("upstream health check", self.check, interval_s=interval_s)
        self.unready_reason: str | None = NOT_CHECKED
        """Why the upstream is not ready as of the last check; None when it is."""

    async def check(self) -> None:
        """Probe health and, when healthy, refresh the model list."""
        reason = await self._upstream.probe_health()
        self.unready_reason = reason
        self._metrics.set_upstream_healthy(reason is None)
        if reason is None:
            models = await self._upstream.fetch_models()
            if models is not None:
                self._catalog.update(models)

    def start(self) -> None:
        self._job.start()

    async def stop(self) -> None:
        await self._job.stop()
