"""Engine discovery: the engines behind a DNS name (a Kubernetes headless Service), kept in the
router as they come and go (docs/scale-out.md, engine discovery).

    lookup = DnsLookup("engine-headless", nameserver="10.96.0.10", timeout_s=2)
    discovery = EngineDiscovery(settings, router, lookup, changed=on_change)
    await discovery.refresh()          # at startup, before traffic
    discovery.start() ... await discovery.stop()

Rules:
- lookups use dnspython (`getaddrinfo` cannot be pointed at a server nor tells the TTL);
  each answer is screened by `dns_answer.AnswerScreen`;
- new addresses join (in the rotation once `/health` passes; `changed` probes at once);
  addresses no longer listed drain (`Router.drain`, `reap` every lookup);
- NXDOMAIN or no records: every engine drains; no answer at all: the last good answer stays
  (a DNS outage must not empty a working gateway), counted as a discovery error;
- the next lookup comes at the answer's TTL, within [`MIN_INTERVAL_S`,
  `discovery_interval_s`]; after a failure, `RETRY_S` later (or the interval, if shorter).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import dns.asyncresolver
import dns.exception
import dns.rdatatype
import dns.resolver

from serving.gateway.addresses import parse_nameserver
from serving.gateway.failures import GatewayException
from serving.gateway.periodic import Periodic
from serving.gateway.routing.dns_answer import AnswerScreen, own_addresses
from serving.gateway.routing.router import Engine, Router
from serving.gateway.settings import GatewaySettings
from serving.gateway.upstream import UpstreamClient

logger = logging.getLogger(__name__)

MIN_INTERVAL_S = 1.0
RETRY_S = 2.0
# Addresses a warning names for each reason; past them, a count (an answer may be huge).
NAMED = 5


class LookupFailed(GatewayException):
    """The nameserver gave no answer (the last good one stays)."""


@dataclass(frozen=True)
class Found:
    addresses: frozenset[str]
    """The engines' IP addresses (empty: the name has none)."""
    ttl_s: float | None
    """Seconds the answer may be cached; None for an empty answer."""


class DnsLookup:
    """A and AAAA records of one name, from one nameserver (or resolv.conf's)."""

    def __init__(self, name: str, *, nameserver: str | None, timeout_s: float) -> None:
        self.name = name
        resolver = dns.asyncresolver.Resolver(configure=nameserver is None)
        if nameserver is not None:
            host, port = parse_nameserver(nameserver)
            resolver.nameservers = [host]
            resolver.port = port
        resolver.lifetime = timeout_s
        self._resolver = resolver

    async def find(self) -> Found:
        answers = await asyncio.gather(self._records("A"), self._records("AAAA"))
        addresses: set[str] = set()
        ttls: list[float] = []
        for found, ttl in answers:
            addresses.update(found)
            if ttl is not None:
                ttls.append(ttl)
        return Found(frozenset(addresses), min(ttls) if ttls else None)

    async def _records(self, kind: str) -> tuple[list[str], float | None]:
        try:
            # search=True: a short Service name takes resolv.conf's search list, as in a pod
            answer = await self._resolver.resolve(
                self.name, kind, search=True, raise_on_no_answer=False
            )
        except dns.resolver.NXDOMAIN:
            return [], None
        except dns.exception.DNSException as exc:  # timeout, SERVFAIL, no server answered
            raise LookupFailed(f"{kind} {self.name}: {type(exc).__name__}") from exc
        if answer.rrset is None:
            return [], None
        wanted = dns.rdatatype.from_text(kind)
        found = [rdata.to_text() for rdata in answer.rrset if rdata.rdtype == wanted]
        return found, float(answer.rrset.ttl)


class EngineDiscovery:
    def __init__(
        self,
        settings: GatewaySettings,
        router: Router,
        lookup: DnsLookup,
        *,
        changed: Callable[[], Awaitable[None]],
    ) -> None:
        self._settings = settings
        self._router = router
        self._lookup = lookup
        self._changed = changed
        template = urlsplit(settings.upstream_urls[0])
        self._scheme = template.scheme
        self._port = template.port or (443 if template.scheme == "https" else 80)
        self._path = template.path
        self._engines: dict[str, Engine] = {}
        self._screen = AnswerScreen(
            max_engines=settings.discovery_max_engines,
            allow_local=settings.discovery_allow_local,
            own=own_addresses(settings.host),
        )
        # What the last answer had dropped: the warning comes when it changes, not at every
        # lookup (one a second with a short TTL).
        self._dropped: dict[str, str] = {}
        # each round returns the wait before the next (the answer's TTL, bounded)
        self._job = Periodic(
            "engine discovery", self.refresh, interval_s=settings.discovery_interval_s
        )
        self.errors = 0
        """Lookups that got no answer (`gateway_engine_discovery_errors_total`)."""
        self.last_error: str | None = None

    def url_for(self, address: str) -> str:
        host = f"[{address}]" if ":" in address else address
        return f"{self._scheme}://{host}:{self._port}{self._path}"

    async def refresh(self) -> float:
        """One lookup applied to the router; seconds until the next one."""
        interval = self._settings.discovery_interval_s
        try:
            found = await self._lookup.find()
        except LookupFailed as exc:
            self.errors += 1
            self.last_error = str(exc)
            logger.warning("engine discovery: no answer (%s); keeping the last engines", exc)
            await self.reap()
            return max(MIN_INTERVAL_S, min(interval, RETRY_S))
        self.last_error = None
        screened = self._screen.apply(found.addresses)
        if screened.dropped != self._dropped:
            self._dropped = screened.dropped
            if screened.dropped:
                logger.warning(
                    "engine discovery: %s answers %d address(es); dropped %s",
                    self._lookup.name, len(found.addresses), describe(screened.dropped),
                )  # fmt: skip
        known = set(self._engines)
        joined = sorted(screened.kept - known)
        left = sorted(known - screened.kept)
        for address in joined:
            engine = Engine(UpstreamClient(self._settings, self.url_for(address)))
            await engine.client.start()
            self._engines[address] = engine
            self._router.add(engine)
        for address in left:
            self._router.drain(self._engines.pop(address))
        if joined or left:
            logger.info(
                "engine discovery: %s answers %d engine(s); joined %s, draining %s",
                self._lookup.name, len(screened.kept), joined or "none", left or "none",
            )  # fmt: skip
            await self._changed()
        await self.reap()
        ttl = interval if found.ttl_s is None else found.ttl_s
        return max(MIN_INTERVAL_S, min(interval, ttl))

    async def reap(self) -> None:
        """Close the clients of drained engines that have finished their last request."""
        for engine in self._router.reap():
            await engine.client.close()

    def start(self) -> None:
        self._job.start()

    async def stop(self) -> None:
        await self._job.stop()


def describe(dropped: dict[str, str]) -> str:
    """`dropped` (in address order) for a log line, by reason: "loopback: 127.0.0.1, ::1;
    past the cap of 64 engines: 4936 (10.1.0.65, 10.1.0.66, ...)"."""
    by_reason: dict[str, list[str]] = {}
    for address, why in dropped.items():
        by_reason.setdefault(why, []).append(address)
    parts = []
    for why, addresses in sorted(by_reason.items()):
        named = ", ".join(addresses[:NAMED])
        if len(addresses) > NAMED:
            named = f"{len(addresses)} ({named}, ...)"
        parts.append(f"{why}: {named}")
    return "; ".join(parts)
