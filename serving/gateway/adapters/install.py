"""Runtime adapters in a running gateway: the registry, the sync job and the admin routes.

    adapters = install_adapters(settings, router, catalog, admin)   # by `assembly.assemble`
    adapters.first_round(); adapters.start() ... adapters.stop()    # the lifespan
    await adapters.close()                                          # the registry, at the end

With `runtime_adapters` off the admin routes answer 403 and nothing runs. On, the registry
lives in Redis with `redis_url` (every replica reads the same set), else in keys.db; the sync
runs once at startup (after the first health check) and then every `health_interval_s`, so an
engine that joins (discovery, a restart) gets the adapters within one interval of its first
passing probe; until it lists them, no request for them is sent to it.
"""

from __future__ import annotations

import logging
from pathlib import Path

from serving.gateway.adapters.admin import AdapterRoutes
from serving.gateway.adapters.registry import (
    AdapterRegistry,
    AdapterStoreUnavailable,
    RedisAdapterRegistry,
    SqliteAdapterRegistry,
)
from serving.gateway.adapters.sync import AdapterSync
from serving.gateway.admin.api import AdminApi
from serving.gateway.catalog import ModelCatalog
from serving.gateway.periodic import Periodic
from serving.gateway.routing.router import Router
from serving.gateway.settings import GatewaySettings

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

    async def close(self) -> None:
        """The registry's connection (the lifespan's async closers call it)."""
        if self.sync is not None:
            await self.sync.registry.close()


def install_adapters(
    settings: GatewaySettings, router: Router, catalog: ModelCatalog, admin: AdminApi
) -> RuntimeAdapters:
    """The registry and its sync over `router`'s engines (when `runtime_adapters` is on), and
    the adapter routes on `admin`; the caller closes it at shutdown (`close`)."""
    sync: AdapterSync | None = None
    if settings.runtime_adapters:
        registry: AdapterRegistry
        if settings.redis_url:
            registry = RedisAdapterRegistry.from_url(settings.redis_url)
        else:
            assert settings.keys_db is not None  # the settings require one of the two
            registry = SqliteAdapterRegistry(Path(settings.keys_db))
        sync = AdapterSync(registry, router, catalog)
    routes = AdapterRoutes(sync, router, catalog, retry_after_s=settings.retry_after_s)
    routes.register(admin)
    return RuntimeAdapters(sync, interval_s=settings.health_interval_s)
