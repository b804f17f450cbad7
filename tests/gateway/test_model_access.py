"""Which models a key sees and reaches: /v1/models per key, default adapters, per-adapter
limits, and requests for an adapter sent only to the engines that serve it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from serving.gateway.keys import SqliteKeyStore
from serving.gateway.quota import Limits
from tests.gateway.conftest import GatewayFactory, eventually
from tests.gateway.fake_upstream import FakeUpstream
from tests.gateway.servers import TEST_KEY, GatewayServer, http_client
from tests.gateway.test_completions import body, post

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def with_adapter(upstream: FakeUpstream) -> Iterator[FakeUpstream]:
    """The shared fake upstream listing the adapter `team-a` (on base `fake`) for one test."""
    upstream.adapters = {"team-a": "fake"}
    yield upstream
    upstream.adapters = {}


@pytest.fixture
def keyed(
    make_gateway: GatewayFactory, keys: SqliteKeyStore, with_adapter: FakeUpstream
) -> GatewayServer:
    return make_gateway(keys_db=str(keys.path))


def _ids(gateway: GatewayServer, secret: str) -> list[str]:
    with http_client(gateway.url, key=secret) as http:
        response = http.get("/v1/models")
    assert response.status_code == 200, response.text
    assert response.json()["object"] == "list"
    return [entry["id"] for entry in response.json()["data"]]


def test_the_model_list_shows_a_key_only_what_it_may_use(
    keyed: GatewayServer, keys: SqliteKeyStore
) -> None:
    _, everything = keys.create("all")
    _, adapter_only = keys.create("a", models=["team-a"])
    assert _ids(keyed, TEST_KEY) == ["fake", "team-a"]
    assert _ids(keyed, everything) == ["fake", "team-a"]
    assert _ids(keyed, adapter_only) == ["team-a"]
    with http_client(keyed.url, key=adapter_only) as http:
        entry = http.get("/v1/models").json()["data"][0]
    assert entry["parent"] == "fake"  # the engine's own entry


def test_a_key_bound_to_an_adapter_cannot_reach_the_base_model(
    keyed: GatewayServer, keys: SqliteKeyStore, upstream: FakeUpstream, token: str
) -> None:
    _, secret = keys.create("a", models=["team-a"])
    refused = post(keyed, secret, body("fake", max_tokens=2), token)
    assert refused.status_code == 404
    assert refused.json()["error"]["code"] == "model_not_found"
    assert post(keyed, secret, body("team-a", max_tokens=2), token).status_code == 200
    assert [sent["model"] for sent in upstream.received(token)] == ["team-a"]


def test_a_default_adapter_serves_requests_for_the_base_model(
    keyed: GatewayServer, keys: SqliteKeyStore, upstream: FakeUpstream, token: str
) -> None:
    _, secret = keys.create("a", models=["team-a"], default_adapter="team-a")
    for stream in (False, True):
        response = post(keyed, secret, body("fake", max_tokens=2, stream=stream), token)
        assert response.status_code == 200, response.text
    assert [sent["model"] for sent in upstream.received(token)] == ["team-a", "team-a"]
    # a key with every model and a default adapter: only base-model names are redirected
    _, open_key = keys.create("b", default_adapter="team-a")
    post(keyed, open_key, body("fake", max_tokens=2), token)
    post(keyed, open_key, body("team-a", max_tokens=2), token)
    post(keyed, open_key, body("made-up", max_tokens=2), token)
    sent = [request["model"] for request in upstream.received(token)]
    assert sent[2:] == ["team-a", "team-a", "made-up"]


def test_per_adapter_limits_hold_beside_the_key_limits(
    keyed: GatewayServer, keys: SqliteKeyStore, token: str
) -> None:
    _, secret = keys.create("a", models=["fake", "team-a"], model_limits={"team-a": Limits(rpm=1)})
    assert post(keyed, secret, body("team-a", max_tokens=2), token).status_code == 200
    second = post(keyed, secret, body("team-a", max_tokens=2), token)
    assert second.status_code == 429
    assert post(keyed, secret, body("fake", max_tokens=2), token).status_code == 200


def test_requests_for_an_adapter_go_only_to_the_engines_that_serve_it(
    make_gateway: GatewayFactory, token: str
) -> None:
    plain, serving = FakeUpstream(), FakeUpstream()
    serving.adapters = {"team-a": "fake"}
    plain.start()
    serving.start()
    try:
        gateway = make_gateway(
            upstream=f"{plain.url},{serving.url}", routing="round-robin", health_interval_s=0.2
        )
        assert eventually(lambda: "team-a" in _ids(gateway, TEST_KEY))
        for _ in range(4):
            assert post(gateway, TEST_KEY, body("team-a", max_tokens=2), token).status_code == 200
            assert post(gateway, TEST_KEY, body("fake", max_tokens=2), token).status_code == 200
        assert [sent["model"] for sent in serving.received(token)].count("team-a") == 4
        assert "team-a" not in [sent["model"] for sent in plain.received(token)]
        # the adapter leaves its engine: requests for it go anywhere (vLLM answers 404)
        serving.adapters = {}
        assert eventually(lambda: "team-a" not in _ids(gateway, TEST_KEY))
    finally:
        plain.stop()
        serving.stop()
