"""Keeps every engine holding the adapters the registry says, as engines come and go.

    sync = AdapterSync(registry, router, catalog)
    await sync.run()          # after every health check, and at once after an admin change
    sync.problems             # (engine label, adapter) -> why the last try failed

A round reads the registry, then for each engine in the rotation whose model list is known
(the catalog, refreshed by the health check): loads each adapter the registry holds that the
engine does not list, and unloads each removed one it still lists; then reads that engine's
list again, so requests for a new adapter go to it at once (`Router.choose` sends them only to
engines that list it). One engine failing does not stop the others: its failure is kept in
`problems` (the admin API shows it) and logged, and the next round tries again. Rounds never
overlap (a lock): an admin change waits for a round under way.
"""

from __future__ import annotations

import asyncio
import logging

from serving.gateway.adapters.registry import AdapterEntry, AdapterRegistry
from serving.gateway.catalog import ModelCatalog
from serving.gateway.routing.router import Engine, Router

logger = logging.getLogger(__name__)


class AdapterSync:
    def __init__(self, registry: AdapterRegistry, router: Router, catalog: ModelCatalog) -> None:
        self.registry = registry
        self._router = router
        self._catalog = catalog
        self._lock = asyncio.Lock()
        self.problems: dict[tuple[str, str], str] = {}
        self.errors = 0
        """Load or unload calls that failed, ever (`gateway_adapter_sync_errors_total`)."""

    async def run(self) -> list[AdapterEntry]:
        """One round over every engine in the rotation; the registry's entries."""
        async with self._lock:
            entries = await self.registry.entries()
            engines = [engine for engine in self._router.engines if engine.in_rotation]
            await asyncio.gather(*(self._engine(engine, entries) for engine in engines))
            return entries

    async def _engine(self, engine: Engine, entries: list[AdapterEntry]) -> None:
        listed = self._catalog.models_of(engine.index)
        if listed is None:
            return  # its list is read by the next health check, then this round's turn
        changed = False
        for entry in entries:
            held = entry.name in listed and listed[entry.name].parent is not None
            if entry.loaded == held:
                self.problems.pop((engine.label, entry.name), None)
                continue
            client = engine.client
            if entry.loaded:
                why = await client.load_adapter(entry.name, entry.path)
            else:
                why = await client.unload_adapter(entry.name)
            changed = True
            key = (engine.label, entry.name)
            if why is None:
                self.problems.pop(key, None)
                continue
            self.errors += 1
            self.problems[key] = why
            verb = "load" if entry.loaded else "unload"
            logger.warning("could not %s adapter %s on %s: %s", verb, entry.name, engine.label, why)
        if changed:
            models = await engine.client.fetch_models()
            if models is not None:
                self._catalog.update(engine.index, models)
