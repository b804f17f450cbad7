"""What the gateway knows about its upstream, refreshed in the background.

    catalog = ModelCatalog()
    monitor = HealthMonitor(upstream, catalog, metrics, interval_s=5, maintain=metering.maintain)
    await monitor.check()      # at startup: health gauge and the model list
    monitor.start() ... await monitor.stop()

`ModelCatalog` holds the served models with their context windows (vLLM's `max_model_len`
in `/v1/models`): they cap an implied max_tokens and bound the `model` metric label, which a
client could otherwise fill with arbitrary names. Every `interval_s` the monitor re-checks
`/health` and `/v1/models` and runs `maintain` (renew leases of running requests, reclaim
expired ones).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from serving.gateway.metrics import GatewayMetrics
from serving.gateway.upstream import UpstreamClient

logger = logging.getLogger(__name__)

OTHER_MODEL = "other"


class ModelCatalog:
    # Models learned from successful responses (not listed by the upstream, e.g. LoRA
    # adapters loaded later) are kept up to this many, so labels stay bounded.
    MAX_LEARNED = 64

    def __init__(self) -> None:
        self._windows: dict[str, int | None] = {}
        self._learned: set[str] = set()

    def update(self, models: dict[str, int | None]) -> None:
        self._windows = models

    def context_window(self, model: str) -> int | None:
        return self._windows.get(model)

    def label(self, model: str) -> str:
        """`model` if the upstream is known to serve it, else `other`."""
        if model in self._windows or model in self._learned:
            return model
        return OTHER_MODEL

    def learn(self, model: str) -> None:
        """The upstream answered 2xx for `model`: it is real."""
        if model not in self._windows and len(self._learned) < self.MAX_LEARNED:
            self._learned.add(model)


class HealthMonitor:
    def __init__(
        self,
        upstream: UpstreamClient,
        catalog: ModelCatalog,
        metrics: GatewayMetrics,
        *,
        interval_s: float,
        maintain: Callable[[], None],
    ) -> None:
        self._upstream = upstream
        self._catalog = catalog
        self._metrics = metrics
        self._interval_s = interval_s
        self._maintain = maintain
        self._task: asyncio.Task[None] | None = None

    async def probe(self) -> str | None:
        """None when the upstream is healthy, else why not; updates the health gauge."""
        reason = await self._upstream.probe_health()
        self._metrics.set_upstream_healthy(reason is None)
        return reason

    async def check(self) -> None:
        """Probe health and, when healthy, refresh the model list."""
        if await self.probe() is None:
            models = await self._upstream.fetch_models()
            if models is not None:
                self._catalog.update(models)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                await self.check()
                self._maintain()
            except Exception:  # the loop must outlive any one failure; it is logged
                logger.exception("background upstream check failed")
