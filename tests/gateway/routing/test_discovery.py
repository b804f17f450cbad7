"""Engine discovery against a real DNS server (dnsmasq): fake engines on their own loopback
addresses, one port, the way a headless Service's pods look to the gateway (loopback answers
are allowed here with `discovery_allow_local`); and what an answer may add, from a lookup that
answers what the test sets."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from serving.gateway.metrics import RETIRED
from serving.gateway.routing.discovery import DnsLookup, EngineDiscovery, Found, LookupFailed
from serving.gateway.routing.router import Router
from serving.gateway.settings import GatewaySettings
from tests.gateway.conftest import GatewayFactory, eventually
from tests.gateway.fake_upstream import FakeUpstream
from tests.gateway.routing.dns_server import DOMAIN, DnsServer
from tests.gateway.scrape import scrape, value
from tests.gateway.servers import GatewayServer, closed_port, http_client

NAME = f"engines.{DOMAIN}"
HOSTS = ("127.0.0.2", "127.0.0.3")
# Discovery looks every second here (dnsmasq's TTL); joins and drains show within a few.
CHANGE_S = 15.0


@pytest.fixture
def engines() -> Iterator[tuple[FakeUpstream, FakeUpstream]]:
    port = closed_port()
    pair = (FakeUpstream(host=HOSTS[0], port=port), FakeUpstream(host=HOSTS[1], port=port))
    for engine in pair:
        engine.start()
    yield pair
    for engine in pair:
        engine.stop()


def discovering(
    make_gateway: GatewayFactory,
    dns: DnsServer,
    engines: tuple[FakeUpstream, ...],
    **options: object,
) -> GatewayServer:
    return make_gateway(
        upstream=f"dns+http://{NAME}:{engines[0].port}",
        dns_nameserver=dns.nameserver,
        discovery_interval_s=1.0,
        discovery_allow_local=True,  # the fake engines listen on loopback addresses
        health_interval_s=0.5,
        routing="least-loaded",
        **options,
    )


def engine_series(gateway: GatewayServer, name: str) -> dict[str, float]:
    return {
        dict(labels)["engine"]: sample
        for (metric, labels), sample in scrape(gateway).items()
        if metric == name
    }


def chat(http: httpx.Client, token: str) -> httpx.Response:
    body = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    return http.post(f"/v1/chat/completions?t={token}", json=body)


def test_the_lookup_reads_the_addresses_and_ttl_and_nxdomain_is_none(dns_server: DnsServer) -> None:
    dns_server.set(NAME, HOSTS)
    lookup = DnsLookup(NAME, nameserver=dns_server.nameserver, timeout_s=2)
    assert asyncio.run(lookup.find()) == Found(frozenset(HOSTS), 1.0)
    dns_server.set(NAME, [])
    assert asyncio.run(lookup.find()) == Found(frozenset(), None)
    dns_server.pause()
    try:
        with pytest.raises(LookupFailed, match=r"Timeout"):
            asyncio.run(DnsLookup(NAME, nameserver=dns_server.nameserver, timeout_s=0.5).find())
    finally:
        dns_server.resume()


def test_every_address_the_name_answers_gets_requests_labelled_by_address(
    make_gateway: GatewayFactory,
    dns_server: DnsServer,
    engines: tuple[FakeUpstream, FakeUpstream],
    token: str,
) -> None:
    dns_server.set(NAME, HOSTS)
    gateway = discovering(make_gateway, dns_server, engines)
    assert eventually(lambda: value(scrape(gateway), "gateway_engines_healthy") == 2, CHANGE_S)
    with http_client(gateway.url) as http:
        for _ in range(4):
            assert chat(http, token).status_code == 200
    assert [len(engine.received(token)) for engine in engines] == [2, 2]
    assert engine_series(gateway, "gateway_engine_requests_total") == {
        engine.address: 2.0 for engine in engines
    }
    assert value(scrape(gateway), "gateway_engines_known") == 2


def test_a_new_address_joins_once_its_health_passes(
    make_gateway: GatewayFactory,
    dns_server: DnsServer,
    engines: tuple[FakeUpstream, FakeUpstream],
    token: str,
) -> None:
    second = engines[1]
    dns_server.set(NAME, HOSTS[:1])
    second.healthy = False
    gateway = discovering(make_gateway, dns_server, engines, engine_slots=4)
    dns_server.set(NAME, HOSTS)
    assert eventually(lambda: value(scrape(gateway), "gateway_engines_known") == 2, CHANGE_S)
    assert value(scrape(gateway), "gateway_engines_healthy") == 1
    # the fair queue's slots count the engine that serves, not the one that is only known
    assert value(scrape(gateway), "gateway_queue_slots") == 4
    with http_client(gateway.url) as http:
        for _ in range(3):
            assert chat(http, f"{token}-a").status_code == 200
        assert len(second.received(f"{token}-a")) == 0  # not healthy yet: not in the rotation
        second.healthy = True
        assert eventually(lambda: value(scrape(gateway), "gateway_engines_healthy") == 2, CHANGE_S)
        assert value(scrape(gateway), "gateway_queue_slots") == 8
        for _ in range(4):
            assert chat(http, f"{token}-b").status_code == 200
    assert len(second.received(f"{token}-b")) == 2


def test_a_vanished_address_drains_its_streams_finish_and_it_gets_nothing_new(
    make_gateway: GatewayFactory,
    dns_server: DnsServer,
    engines: tuple[FakeUpstream, FakeUpstream],
    token: str,
) -> None:
    dns_server.set(NAME, HOSTS)
    gateway = discovering(make_gateway, dns_server, engines)
    assert eventually(lambda: value(scrape(gateway), "gateway_engines_healthy") == 2, CHANGE_S)
    streams = [f"{token}-{n}" for n in range(2)]
    bodies: dict[str, tuple[int, str]] = {}

    def stream(t: str) -> None:
        with http_client(gateway.url, timeout=60) as http:
            response = http.post(f"/v1/gated-stream?t={t}", json={})
            bodies[t] = (response.status_code, response.text)

    threads = [threading.Thread(target=stream, args=(t,)) for t in streams]
    for t, thread in zip(streams, threads, strict=True):
        thread.start()
        assert eventually(lambda t=t: any(e.seen(f"{t}:started") for e in engines))  # type: ignore[misc]
    # one stream on each engine (least-loaded); the second engine leaves the name
    assert sorted(e.seen(f"{streams[0]}:started") for e in engines) == [False, True]
    dns_server.set(NAME, HOSTS[:1])
    assert eventually(lambda: value(scrape(gateway), "gateway_engines_known") == 1, CHANGE_S)
    leaving = engines[1].address
    assert engine_series(gateway, "gateway_engine_in_flight_requests")[leaving] == 1
    assert engine_series(gateway, "gateway_engine_in_rotation")[leaving] == 0
    with http_client(gateway.url) as http:
        for _ in range(3):
            assert chat(http, f"{token}-new").status_code == 200
    assert len(engines[1].received(f"{token}-new")) == 0
    for engine in engines:
        for t in streams:
            engine.release(t)
    for thread in threads:
        thread.join(30)
    # both streams ran to their end, the drained engine's too
    assert all(status == 200 and text.count("data:") >= 3 for status, text in bodies.values())
    # its last request done, the drained engine is forgotten (its connections closed); its
    # counts go on under "retired", so a sum over engines never goes down
    assert eventually(
        lambda: leaving not in engine_series(gateway, "gateway_engine_requests_total"), CHANGE_S
    )
    assert engine_series(gateway, "gateway_engine_requests_total") == {
        engines[0].address: 4.0,
        RETIRED: 1.0,
    }


def test_a_name_without_addresses_is_503_at_once_until_one_appears(
    make_gateway: GatewayFactory,
    dns_server: DnsServer,
    engines: tuple[FakeUpstream, FakeUpstream],
    token: str,
) -> None:
    dns_server.set(NAME, [])
    gateway = discovering(make_gateway, dns_server, engines, upstream_connect_timeout_s=30)
    with http_client(gateway.url) as http:
        started = time.monotonic()
        response = chat(http, token)
        assert time.monotonic() - started < 5
        assert response.status_code == 503
        assert response.json()["error"]["code"] == "upstream_unavailable"
        ready = http.get("/readyz")
        assert ready.status_code == 503 and "no engine" in ready.json()["reason"]
        assert value(scrape(gateway), "gateway_engines_known") == 0
        dns_server.set(NAME, HOSTS[1:])
        assert eventually(lambda: http.get("/readyz").status_code == 200, CHANGE_S)
        assert chat(http, token).status_code == 200


def test_a_dns_outage_keeps_the_last_engines_and_counts_errors(
    make_gateway: GatewayFactory,
    dns_server: DnsServer,
    engines: tuple[FakeUpstream, FakeUpstream],
    token: str,
) -> None:
    dns_server.set(NAME, HOSTS)
    gateway = discovering(make_gateway, dns_server, engines, readiness_timeout_s=0.5)
    assert eventually(lambda: value(scrape(gateway), "gateway_engines_healthy") == 2, CHANGE_S)
    dns_server.pause()
    try:
        assert eventually(
            lambda: value(scrape(gateway), "gateway_engine_discovery_errors_total") >= 2, CHANGE_S
        )
        assert value(scrape(gateway), "gateway_engines_healthy") == 2
        with http_client(gateway.url) as http:
            for _ in range(4):
                assert chat(http, token).status_code == 200
        assert [len(engine.received(token)) for engine in engines] == [2, 2]
    finally:
        dns_server.resume()


def test_a_dns_upstream_is_one_url_and_the_nameserver_an_ip() -> None:
    settings = GatewaySettings.create(
        upstream="dns+http://engine-headless:8000/", api_keys=["sk-test"], dns_nameserver="[::1]:53"
    )
    assert settings.discovered and settings.upstream_urls == ("http://engine-headless:8000",)
    assert not GatewaySettings.create(upstream="http://a:1", api_keys=["sk-test"]).discovered


class Answers(DnsLookup):
    """A lookup that answers what the test sets, no DNS server asked."""

    def __init__(self, addresses: list[str]) -> None:
        super().__init__(NAME, nameserver="127.0.0.1", timeout_s=1)
        self.addresses = addresses

    async def find(self) -> Found:
        return Found(frozenset(self.addresses), 5.0)


def discovered(answers: Answers, rounds: int = 1, **options: object) -> list[str]:
    """The engines (labels) a router holds after `rounds` lookups of `answers`."""
    settings = GatewaySettings.create(
        upstream="dns+http://engines.example:8000", api_keys=["sk-test"], **options
    )
    router = Router([], policy="least-loaded", overload=8)

    async def nothing() -> None:
        pass

    async def run() -> list[str]:
        discovery = EngineDiscovery(settings, router, answers, changed=nothing)
        for _ in range(rounds):
            await discovery.refresh()
        for engine in router.engines:
            await engine.client.close()
        return [engine.label for engine in router.engines]

    return asyncio.run(run())


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_a_huge_answer_adds_the_capped_engines_and_warns_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    answer = [f"10.1.{n // 256}.{n % 256}" for n in range(1, 5001)]
    with caplog.at_level(logging.WARNING, logger="serving.gateway.routing.discovery"):
        engines = discovered(Answers(answer), rounds=3, discovery_max_engines=3)
    assert engines == ["10.1.0.1:8000", "10.1.0.2:8000", "10.1.0.3:8000"]
    [warning] = warnings(caplog)  # the same answer again is not news
    assert "past the cap of 3 engines: 4997 (10.1.0.4, " in warning, warning


def test_local_addresses_in_an_answer_are_dropped_unless_allowed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    local = ["127.0.0.1", "169.254.169.254", "0.0.0.0", "::1", "fe80::1"]
    answers = Answers(["10.0.0.7", *local])
    with caplog.at_level(logging.WARNING, logger="serving.gateway.routing.discovery"):
        assert discovered(answers) == ["10.0.0.7:8000"]
    [warning] = warnings(caplog)
    assert "link-local: 169.254.169.254, fe80::1;" in warning, warning
    assert "loopback: 127.0.0.1, ::1;" in warning and "unspecified: 0.0.0.0" in warning
    assert len(discovered(answers, discovery_allow_local=True)) == 6
