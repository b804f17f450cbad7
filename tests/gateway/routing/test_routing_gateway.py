"""The gateway routing over two fake engines: spread, affinity, rotation, failover before the
first byte only, and 503 at once when no engine is left (docs/architecture.md, reliability
cases 6 and 13).

Fake engines stand in for vLLM here because the faults (a 500, a reset before the headers, a
reset mid-stream) must happen on demand; tests/integration/replicas/ does the same
over two real vLLM engines.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from tests.gateway.conftest import GatewayFactory, eventually
from tests.gateway.fake_upstream import FakeUpstream
from tests.gateway.scrape import scrape, settled, value
from tests.gateway.servers import http_client


def both(engines: tuple[FakeUpstream, FakeUpstream]) -> str:
    return f"{engines[0].url},{engines[1].url}"


def served_by(engines: tuple[FakeUpstream, FakeUpstream], token: str) -> list[int]:
    """How many requests with `?t=token` each engine got."""
    return [len(engine.received(token)) for engine in engines]


def chat(
    http: httpx.Client, token: str, messages: list[dict[str, str]], **extra: object
) -> httpx.Response:
    body = {"model": "fake", "messages": messages, "max_tokens": 4, **extra}
    return http.post(f"/v1/chat/completions?t={token}", json=body)


def conversation_turn(topic: str, turn: int) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": "You answer briefly and well. " * 4}]
    for t in range(turn + 1):
        messages.append({"role": "user", "content": f"Tell me about {topic}, part {t}. " * 3})
        if t < turn:
            messages.append({"role": "assistant", "content": f"Here is part {t} on {topic}. " * 3})
    return messages


def test_least_loaded_spreads_concurrent_requests(
    make_gateway: GatewayFactory, engines: tuple[FakeUpstream, FakeUpstream], token: str
) -> None:
    gateway = make_gateway(upstream=both(engines), routing="least-loaded")
    tokens = [f"{token}-{n}" for n in range(2)]
    results: list[int] = []

    def call(t: str) -> None:
        with http_client(gateway.url, timeout=30) as http:
            results.append(http.post(f"/v1/gated-stream?t={t}", json={}).status_code)

    threads = [threading.Thread(target=call, args=(t,)) for t in tokens]
    threads[0].start()
    assert eventually(lambda: any(e.seen(f"{tokens[0]}:started") for e in engines))
    threads[1].start()
    assert eventually(lambda: any(e.seen(f"{tokens[1]}:started") for e in engines))
    homes = [[e.seen(f"{t}:started") for e in engines].index(True) for t in tokens]
    assert sorted(homes) == [0, 1]  # the second went to the engine without a request
    for engine in engines:
        for t in tokens:
            engine.release(t)
    for thread in threads:
        thread.join(30)
    assert results == [200, 200]


def test_affinity_keeps_each_conversation_on_one_engine_and_round_robin_does_not(
    make_gateway: GatewayFactory, engines: tuple[FakeUpstream, FakeUpstream], token: str
) -> None:
    affinity = make_gateway(upstream=both(engines), routing="affinity")
    with http_client(affinity.url) as http:
        for turn in range(4):
            for topic in ("tides", "volcanoes"):
                assert (
                    chat(http, f"{token}-{topic}", conversation_turn(topic, turn)).status_code
                    == 200
                )
    tides, volcanoes = (
        served_by(engines, f"{token}-tides"),
        served_by(engines, f"{token}-volcanoes"),
    )
    assert sorted(tides) == [0, 4] and sorted(volcanoes) == [0, 4]
    assert tides != volcanoes  # two conversations, two engines

    spread = make_gateway(upstream=both(engines), routing="round-robin")
    with http_client(spread.url) as http:
        for turn in range(4):
            assert chat(http, f"{token}-rr", conversation_turn("tides", turn)).status_code == 200
    assert served_by(engines, f"{token}-rr") == [2, 2]


def test_affinity_gives_way_to_an_overloaded_engine(
    make_gateway: GatewayFactory, engines: tuple[FakeUpstream, FakeUpstream], token: str
) -> None:
    gateway = make_gateway(upstream=both(engines), routing="affinity", routing_overload=0)
    with http_client(gateway.url, timeout=30) as http:
        assert chat(http, token, conversation_turn("tides", 0)).status_code == 200
        home = served_by(engines, token).index(1)
        held = threading.Thread(
            target=lambda: chat(
                http_client(gateway.url, timeout=30),
                f"{token}-held",
                conversation_turn("tides", 1),
                model="gated",
            )
        )
        held.start()
        assert eventually(lambda: engines[home].seen(f"{token}-held:started"))
        assert chat(http, token, conversation_turn("tides", 2)).status_code == 200
        assert served_by(engines, token)[1 - home] == 1  # the busy home was passed over
        engines[home].release(f"{token}-held")
        held.join(30)


def test_an_unhealthy_engine_leaves_the_rotation_and_comes_back(
    make_gateway: GatewayFactory, engines: tuple[FakeUpstream, FakeUpstream], token: str
) -> None:
    engines[0].healthy = False
    gateway = make_gateway(upstream=both(engines), routing="least-loaded", health_interval_s=0.2)
    with http_client(gateway.url) as http:
        for n in range(4):
            assert chat(http, token, conversation_turn(f"t{n}", 0)).status_code == 200
        assert served_by(engines, token) == [0, 4]
        assert value(scrape(gateway), "gateway_engine_in_rotation", engine=engines[0].address) == 0
        assert http.get("/readyz").status_code == 200  # one engine is enough
        engines[0].healthy = True
        assert eventually(
            lambda: (
                value(scrape(gateway), "gateway_engine_in_rotation", engine=engines[0].address) == 1
            )
        )
        for n in range(4):
            assert chat(http, f"{token}-back", conversation_turn(f"t{n}", 0)).status_code == 200
        assert served_by(engines, f"{token}-back") == [2, 2]


def test_no_engine_in_rotation_is_a_503_at_once_and_readyz_says_why(
    make_gateway: GatewayFactory, engines: tuple[FakeUpstream, FakeUpstream], token: str
) -> None:
    for engine in engines:
        engine.healthy = False
    gateway = make_gateway(
        upstream=both(engines), health_interval_s=0.2, upstream_connect_timeout_s=30
    )
    with http_client(gateway.url) as http:
        started = time.monotonic()
        response = chat(http, token, conversation_turn("tides", 0))
        assert time.monotonic() - started < 5  # not a connect timeout (30 s)
        assert response.status_code == 503
        assert response.json()["error"]["code"] == "upstream_unavailable"
        assert response.headers["retry-after"] == "1"
        assert served_by(engines, token) == [0, 0]
        ready = http.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["reason"].startswith(
            "no engine in rotation: engine 0: upstream /health answered 503"
        )
        assert "127.0.0.1" not in ready.text  # no internal address to unauthenticated callers
        engines[1].healthy = True
        assert eventually(lambda: http.get("/readyz").status_code == 200)
        assert chat(http, token, conversation_turn("tides", 0)).status_code == 200
    assert settled(gateway)


def test_a_refused_connection_fails_over_and_takes_the_engine_out(
    make_gateway: GatewayFactory, token: str
) -> None:
    doomed, survivor = FakeUpstream(), FakeUpstream()
    doomed.start()
    survivor.start()
    try:
        gateway = make_gateway(
            upstream=f"{doomed.url},{survivor.url}", routing="least-loaded", health_interval_s=3600
        )
        doomed.stop()  # in the rotation still: the next probe is an hour away
        with http_client(gateway.url) as http:
            for n in range(4):
                assert chat(http, token, conversation_turn(f"t{n}", 0)).status_code == 200
        samples = scrape(gateway)
        assert value(samples, "gateway_engine_in_rotation", engine=doomed.address) == 0
        assert value(samples, "gateway_engine_failovers_total", engine=doomed.address) == 1
        assert value(samples, "gateway_engine_requests_total", engine=survivor.address) == 4
        assert len(survivor.received(token)) == 4
        assert settled(gateway)
    finally:
        survivor.stop()


@pytest.mark.parametrize(("model", "status"), [("fault-500", 502)])
def test_a_5xx_before_any_byte_is_tried_once_more_elsewhere(
    make_gateway: GatewayFactory,
    engines: tuple[FakeUpstream, FakeUpstream],
    token: str,
    model: str,
    status: int,
) -> None:
    gateway = make_gateway(upstream=both(engines), routing="least-loaded")
    with http_client(gateway.url) as http:
        response = chat(http, token, conversation_turn("tides", 0), model=model)
    assert response.status_code == status
    assert served_by(engines, token) == [1, 1]  # once on each, never a third time
    samples = scrape(gateway)
    addresses = [engine.address for engine in engines]
    assert sum(value(samples, "gateway_engine_failovers_total", engine=e) for e in addresses) == 1
    # each attempt was counted in flight on its own engine, and both are back at zero
    in_flight = [value(samples, "gateway_engine_in_flight_requests", engine=e) for e in addresses]
    assert in_flight == [0, 0]
    assert settled(gateway)


def test_a_reset_before_the_headers_is_tried_once_more_elsewhere(
    make_gateway: GatewayFactory, engines: tuple[FakeUpstream, FakeUpstream], token: str
) -> None:
    gateway = make_gateway(upstream=both(engines), routing="least-loaded")
    with http_client(gateway.url) as http:
        response = http.post(f"/v1/reset-before-headers?t={token}", json={})
    assert response.status_code == 502
    assert [e.seen(f"{token}:started") for e in engines] == [True, True]
    assert settled(gateway)


def test_a_stream_that_started_is_never_replayed(
    make_gateway: GatewayFactory, engines: tuple[FakeUpstream, FakeUpstream], token: str
) -> None:
    gateway = make_gateway(upstream=both(engines), routing="least-loaded")
    with http_client(gateway.url) as http:
        body = {
            "model": "fault-reset",
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
        }
        response = http.post(f"/v1/chat/completions?t={token}", json=body)
    assert response.status_code == 200
    assert '"error"' in response.text and "[DONE]" not in response.text
    assert sorted(served_by(engines, token)) == [0, 1]
    assert settled(gateway)


def test_the_fair_queue_counts_the_slots_of_engines_in_rotation_only(
    make_gateway: GatewayFactory, engines: tuple[FakeUpstream, FakeUpstream]
) -> None:
    """An engine that fails its health check serves nothing: counting its slots would let
    twice the requests through to the other, into vLLM's first-come queue (fair sharing
    off)."""
    engines[1].healthy = False
    gateway = make_gateway(upstream=both(engines), engine_slots=3, health_interval_s=0.1)
    assert value(scrape(gateway), "gateway_queue_slots") == 3
    engines[1].healthy = True
    assert eventually(lambda: value(scrape(gateway), "gateway_queue_slots") == 6)
    engines[0].healthy = False
    assert eventually(lambda: value(scrape(gateway), "gateway_queue_slots") == 3)
