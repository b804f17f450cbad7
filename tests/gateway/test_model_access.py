"""Which models a key sees and reaches: /v1/models per key, default adapters, per-adapter
limits, and requests for an adapter sent only to the engines that serve it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from serving.gateway.auth import Principal
from serving.gateway.catalog import ModelCatalog, ModelInfo
from serving.gateway.completions import served_model
from serving.gateway.errors import GatewayError, ModelNotFoundError, UpstreamUnavailableError
from serving.gateway.keys import SqliteKeyStore
from serving.gateway.keys.record import KeySpec
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
    _, everything = keys.create(KeySpec("all"))
    _, adapter_only = keys.create(KeySpec("a", models=["team-a"]))
    assert _ids(keyed, TEST_KEY) == ["fake", "team-a"]
    assert _ids(keyed, everything) == ["fake", "team-a"]
    assert _ids(keyed, adapter_only) == ["team-a"]
    with http_client(keyed.url, key=adapter_only) as http:
        entry = http.get("/v1/models").json()["data"][0]
    assert entry["parent"] == "fake"  # the engine's own entry


def test_a_key_bound_to_an_adapter_cannot_reach_the_base_model(
    keyed: GatewayServer, keys: SqliteKeyStore, upstream: FakeUpstream, token: str
) -> None:
    _, secret = keys.create(KeySpec("a", models=["team-a"]))
    refused = post(keyed, secret, body("fake", max_tokens=2), token)
    assert refused.status_code == 404
    assert refused.json()["error"]["code"] == "model_not_found"
    assert post(keyed, secret, body("team-a", max_tokens=2), token).status_code == 200
    assert [sent["model"] for sent in upstream.received(token)] == ["team-a"]


def test_a_default_adapter_serves_requests_for_the_base_model(
    keyed: GatewayServer, keys: SqliteKeyStore, upstream: FakeUpstream, token: str
) -> None:
    _, secret = keys.create(KeySpec("a", models=["team-a"], default_adapter="team-a"))
    for stream in (False, True):
        response = post(keyed, secret, body("fake", max_tokens=2, stream=stream), token)
        assert response.status_code == 200, response.text
    assert [sent["model"] for sent in upstream.received(token)] == ["team-a", "team-a"]
    # a key with every model and a default adapter: base-model names are redirected, and a
    # name no engine lists is refused here (it could be a base model the catalog has not seen)
    _, open_key = keys.create(KeySpec("b", default_adapter="team-a"))
    post(keyed, open_key, body("fake", max_tokens=2), token)
    post(keyed, open_key, body("team-a", max_tokens=2), token)
    unknown = post(keyed, open_key, body("made-up", max_tokens=2), token)
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "model"
    sent = [request["model"] for request in upstream.received(token)]
    assert sent[2:] == ["team-a", "team-a"]


def test_a_default_adapter_no_engine_lists_yet_is_waited_for_not_replaced_by_the_base(
    make_gateway: GatewayFactory, keys: SqliteKeyStore, upstream: FakeUpstream, token: str
) -> None:
    # the engines list the base model but not the adapter (a runtime adapter not loaded yet,
    # an engine restarting): the request must neither reach the base nor go anywhere
    gateway = make_gateway(keys_db=str(keys.path))
    _, secret = keys.create(KeySpec("a", default_adapter="team-a"))  # no --models: every model
    refused = post(gateway, secret, body("fake", max_tokens=2), token)
    assert refused.status_code == 503, refused.text
    assert refused.headers["retry-after"] == "1"
    error = refused.json()["error"]
    assert error["code"] == "upstream_unavailable" and "team-a" in error["message"]
    assert upstream.received(token) == []


def _catalog(*lists: dict[str, str | None]) -> ModelCatalog:
    """A catalog with one engine per list of `name: parent`."""
    catalog = ModelCatalog()
    for engine, listed in enumerate(lists):
        catalog.update(
            engine,
            {
                name: ModelInfo(window=None, parent=p, entry={"id": name})
                for name, p in listed.items()
            },
        )
    return catalog


BASE_ONLY = {"qwen": None}
WITH_ADAPTERS = {"qwen": None, "team-a": "qwen", "team-b": "qwen"}


@pytest.mark.parametrize(
    ("lists", "named", "served"),
    [
        ((WITH_ADAPTERS,), "qwen", "team-a"),  # a base model: the adapter
        ((BASE_ONLY, WITH_ADAPTERS), "qwen", "team-a"),  # on one engine of two is enough
        ((WITH_ADAPTERS,), "team-a", "team-a"),
        ((WITH_ADAPTERS,), "team-b", "team-b"),  # another adapter is not a base model
        ((), "team-a", "team-a"),  # the adapter itself, even before any list is read
        ((BASE_ONLY,), "qwen", UpstreamUnavailableError),  # the adapter is on no engine
        ((), "qwen", UpstreamUnavailableError),  # no list read: qwen may be a base model
        ((WITH_ADAPTERS,), "made-up", ModelNotFoundError),  # may be an unread engine's base
    ],
)
def test_a_key_with_a_default_adapter_is_never_served_by_a_base_model(
    lists: tuple[dict[str, str | None], ...], named: str, served: str | type[GatewayError]
) -> None:
    caller = Principal(key_id="k", default_adapter="team-a")
    catalog = _catalog(*lists)
    if isinstance(served, str):
        assert served_model(caller, named, catalog, retry_after_s=3) == served
        return
    with pytest.raises(served) as refused:
        served_model(caller, named, catalog, retry_after_s=3)
    assert refused.value.http_status in (404, 503)
    if refused.value.http_status == 503:
        assert refused.value.retry_after_s == 3


@pytest.mark.parametrize("lists", [(), (BASE_ONLY,), (WITH_ADAPTERS,)])
@pytest.mark.parametrize("named", ["qwen", "team-a", "made-up"])
def test_without_a_default_adapter_the_named_model_serves(
    lists: tuple[dict[str, str | None], ...], named: str
) -> None:
    assert served_model(Principal(key_id="k"), named, _catalog(*lists), retry_after_s=3) == named


def test_per_adapter_limits_hold_beside_the_key_limits(
    keyed: GatewayServer, keys: SqliteKeyStore, token: str
) -> None:
    _, secret = keys.create(
        KeySpec("a", models=["fake", "team-a"], model_limits={"team-a": Limits(rpm=1)})
    )
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
