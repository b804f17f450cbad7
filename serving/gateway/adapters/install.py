"""Runtime adapters in a running gateway: the registry, the sync job and the admin routes.

    self.adapters = install_adapters(self)   # in GatewayApp.__init__, after admin and catalog

With `runtime_adapters` off the admin routes answer 403 and nothing runs. On, the registry
lives in Redis with `redis_url` (every replica reads the same set), else in keys.db; the sync
runs once at startup (after the first health check) and then every `health_interval_s`, so an
engine that joins (discovery, a restart) gets the adapters within one interval of its first
passing probe; until it lists them, no request for them is sent to it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from serving.gateway.adapters.admin import AdapterRoutes
from serving.gateway.adapters.registry import (
    AdapterRegistry,
    AdapterStoreUnavailable,
    RedisAdapterRegistry,
    SqliteAdapterRegistry,
)
from serving.gateway.adapters.sync import AdapterSync
from serving.gateway.periodic import Periodic

if TYPE_CHECKING:
    from serving.gateway.app import GatewayApp

logger = logging.getLogger(__name__)


class RuntimeAdapters:
    def __init__(self, sync: AdapterSync | None, *, interval_s: float) -> None:
        self.sync = sync
        self._job = Periodic("adapter sync", self.run, interval_s=interval_s) if sync else None

    async def run(self) -> None:
        if self.sync is not None:
            await self.sync.run()

    async def first_round(self) -> None:
        """At startup: a store that does not answer is not fatal (the job keeps trying)."""
        try:
            await self.run()
        except AdapterStoreUnavailable as exc:
            logger.warning("%s; runtime adapters are loaded once it answers", exc)

    @property
    def errors(self) -> int:
        return self.sync.errors if self.sync is not None else 0

    def start(self) -> None:
        if self._job is not None:
            self._job.start()

    async def stop(self) -> None:
        if self._job is not None:
            await self._job.stop()


def install_adapters(app: GatewayApp) -> RuntimeAdapters:
    settings = app.settings
    sync: AdapterSync | None = None
    if settings.runtime_adapters:
        registry: AdapterRegistry
        if settings.redis_url:
            registry = RedisAdapterRegistry.from_url(settings.redis_url)
        else:
            assert settings.keys_db is not None  # the settings require one of the two
            registry = SqliteAdapterRegistry(Path(settings.keys_db))
        app.closers.append(registry.close)
        sync = AdapterSync(registry, app.router, app.catalog)
    routes = AdapterRoutes(sync, app.router, app.catalog, retry_after_s=settings.retry_after_s)
    routes.register(app.admin)
    return RuntimeAdapters(sync, interval_s=settings.health_interval_s)
