"""The engines behind one gateway: the router over them and their clients' lifetime, whether
`--upstream` lists them or DNS discovers them (`discovery`).

    fleet = Fleet(settings, changed=on_change)   # on_change: after engines joined or left
    await fleet.open()      # lifespan startup: the first lookup, every engine's client open
    fleet.start() ... await fleet.close()
    fleet.router            # what requests are routed with
    fleet.everything()      # engines in use and draining ones (the metrics show both)
    fleet.size_queue(queue.resize)   # the fair queue's slots: engine_slots x engines in rotation
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

from serving.gateway.routing.discovery import DnsLookup, EngineDiscovery
from serving.gateway.routing.router import Engine, Router
from serving.gateway.settings import GatewaySettings
from serving.gateway.upstream import UpstreamClient


class Fleet:
    def __init__(
        self, settings: GatewaySettings, *, changed: Callable[[], Awaitable[None]]
    ) -> None:
        listed = () if settings.discovered else settings.upstream_urls
        self.router = Router(
            [Engine(UpstreamClient(settings, url)) for url in listed],
            policy=settings.routing,
            overload=settings.routing_overload,
        )
        self._engine_slots = settings.engine_slots
        self.discovery: EngineDiscovery | None = None
        if settings.discovered:
            name = urlsplit(settings.upstream_urls[0]).hostname or ""
            lookup = DnsLookup(
                name, nameserver=settings.dns_nameserver, timeout_s=settings.readiness_timeout_s
            )
            self.discovery = EngineDiscovery(settings, self.router, lookup, changed=changed)

    def everything(self) -> tuple[Engine, ...]:
        return self.router.engines + self.router.draining

    def size_queue(self, resize: Callable[[int], None]) -> None:
        """From now on, `resize(engine_slots x the engines in rotation)` whenever that number
        changes. Only engines in the rotation serve: counting one that failed its health check,
        or a discovered one not yet healthy, would let more requests through than the healthy
        engines run well, and the excess would wait in vLLM's first-come queue instead of the
        fair one (a stale or huge DNS answer would switch fair sharing off)."""
        slots = self._engine_slots
        if slots is None:
            raise ValueError("size_queue: the fair queue needs engine_slots")
        self.router.on_rotation(lambda engines: resize(slots * engines))

    async def open(self) -> None:
        """Before traffic: the first lookup (its engines' clients open as they join), then
        every listed engine's client."""
        if self.discovery is not None:
            await self.discovery.refresh()
        for engine in self.router.engines:
            await engine.client.start()

    def start(self) -> None:
        if self.discovery is not None:
            self.discovery.start()

    async def close(self) -> None:
        if self.discovery is not None:
            await self.discovery.stop()
        for engine in self.everything():
            await engine.client.close()
