"""Runtime adapters through the admin API, over fake engines: loaded on every engine, kept,
given to an engine that (re)joins, unloaded everywhere; refused unless turned on."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.gateway.adapters.conftest import ADMIN, gateway_for
from tests.gateway.conftest import GatewayFactory, eventually
from tests.gateway.fake_upstream import FakeUpstream
from tests.gateway.quota.redis_server import RedisServer
from tests.gateway.scrape import scrape, value
from tests.gateway.servers import TEST_KEY, GatewayServer, http_client
from tests.gateway.test_completions import body, post

pytestmark = pytest.mark.timeout(60)
PATH = "/admin/v1/adapters"


def _admin(gateway: GatewayServer) -> httpx.Client:
    return http_client(gateway.url, key=ADMIN)


def _models(gateway: GatewayServer) -> list[str]:
    with http_client(gateway.url, key=TEST_KEY) as http:
        return [entry["id"] for entry in http.get("/v1/models").json()["data"]]


def test_off_by_default(make_gateway: GatewayFactory) -> None:
    gateway = make_gateway(admin_keys=(ADMIN,))
    with _admin(gateway) as admin:
        response = admin.post(PATH, json={"name": "team-a", "path": "/adapters/a"})
    assert response.status_code == 403
    assert "--runtime-adapters" in response.json()["error"]["message"]


def test_load_reaches_every_engine_and_unload_leaves_none(
    make_gateway: GatewayFactory,
    engines: tuple[FakeUpstream, FakeUpstream],
    tmp_path: Path,
    token: str,
) -> None:
    gateway = gateway_for(make_gateway, engines, tmp_path / "keys.db")
    with _admin(gateway) as admin:
        loaded = admin.post(PATH, json={"name": "team-a", "path": "/adapters/a"})
        assert loaded.status_code == 200, loaded.text
        assert loaded.json()["state"] == "loaded"
        assert sorted(loaded.json()["engines"]) == sorted(e.address for e in engines)
        assert all(engine.adapters == {"team-a": "fake"} for engine in engines)
        assert "team-a" in _models(gateway)  # at once: the answer came after both lists
        assert post(gateway, TEST_KEY, body("team-a", max_tokens=2), token).status_code == 200
        listed = admin.get(PATH).json()["data"]
        assert [(entry["name"], entry["state"]) for entry in listed] == [("team-a", "loaded")]

        gone = admin.delete(PATH + "/team-a")
        assert gone.status_code == 200 and gone.json()["state"] == "removed"
        assert all(engine.adapters == {} for engine in engines)
        assert "team-a" not in _models(gateway)
        assert admin.delete(PATH + "/team-a").status_code == 404


def test_an_engine_that_restarts_gets_the_adapters_back(
    make_gateway: GatewayFactory, engines: tuple[FakeUpstream, FakeUpstream], tmp_path: Path
) -> None:
    gateway = gateway_for(make_gateway, engines, tmp_path / "keys.db")
    with _admin(gateway) as admin:
        assert admin.post(PATH, json={"name": "team-a", "path": "/adapters/a"}).status_code == 200
    engines[1].adapters = {}  # what vLLM remembers of runtime adapters after a restart
    assert eventually(lambda: engines[1].adapters == {"team-a": "fake"}, timeout=10)
    # a gateway started later on the same store puts them on the engines it finds
    engines[0].adapters = engines[1].adapters = {}
    later = gateway_for(make_gateway, engines, tmp_path / "keys.db")
    assert all(engine.adapters == {"team-a": "fake"} for engine in engines)
    assert "team-a" in _models(later)


def test_a_path_no_engine_can_load_is_refused_naming_why(
    make_gateway: GatewayFactory, engines: tuple[FakeUpstream, FakeUpstream], tmp_path: Path
) -> None:
    gateway = gateway_for(make_gateway, engines, tmp_path / "keys.db")
    with _admin(gateway) as admin:
        refused = admin.post(PATH, json={"name": "team-a", "path": "/elsewhere/a"})
        assert refused.status_code == 400
        error = refused.json()["error"]
        assert error["param"] == "path" and "No adapter found" in error["message"]
        assert all(engine.adapters == {} for engine in engines)
        listed = admin.get(PATH).json()["data"]
        assert [(entry["name"], entry["state"]) for entry in listed] == [("team-a", "removed")]
    # both engines refused it once: the errors are counted for the dashboard
    assert value(scrape(gateway), "gateway_adapter_sync_errors_total") >= 2


def test_the_engines_own_adapters_are_neither_loaded_nor_unloaded_here(
    make_gateway: GatewayFactory,
    engines: tuple[FakeUpstream, FakeUpstream],
    tmp_path: Path,
    token: str,
) -> None:
    for engine in engines:
        engine.adapters = {"team-a": "fake"}  # what a profile's lora section starts vLLM with
    gateway = gateway_for(make_gateway, engines, tmp_path / "keys.db")
    with _admin(gateway) as admin:
        taken = admin.post(PATH, json={"name": "team-a", "path": "/adapters/a"})
        assert taken.status_code == 409, taken.text
        error = taken.json()["error"]
        assert error["param"] == "name" and error["type"] == "invalid_request_error"
        assert "profile" in error["message"]
        assert admin.get(PATH).json()["data"] == []  # nothing kept to unload it later
        kept = admin.delete(PATH + "/team-a")
        assert kept.status_code == 409 and kept.json()["error"]["param"] == "name"
        # a runtime adapter beside it loads and unloads as ever
        assert admin.post(PATH, json={"name": "team-b", "path": "/adapters/b"}).status_code == 200
        assert admin.delete(PATH + "/team-b").status_code == 200
    assert all(engine.adapters == {"team-a": "fake"} for engine in engines)
    assert post(gateway, TEST_KEY, body("team-a", max_tokens=2), token).status_code == 200


def test_a_load_waits_for_an_engines_model_list(
    make_gateway: GatewayFactory, engines: tuple[FakeUpstream, FakeUpstream], tmp_path: Path
) -> None:
    # until one list is read the gateway cannot tell the engines' own adapters from others
    for engine in engines:
        engine.healthy = False  # no list is read from an engine that fails its probe
    gateway = gateway_for(make_gateway, engines, tmp_path / "keys.db")
    payload = {"name": "team-a", "path": "/adapters/a"}
    with _admin(gateway) as admin:
        early = admin.post(PATH, json=payload)
        assert early.status_code == 503, early.text
        assert early.headers["retry-after"] == "1"
        assert admin.get(PATH).json()["data"] == []  # nothing kept, not even as removed
        for engine in engines:
            engine.healthy = True
        assert eventually(lambda: admin.post(PATH, json=payload).status_code == 200, timeout=10)
    assert all(engine.adapters == {"team-a": "fake"} for engine in engines)


@pytest.mark.parametrize(
    ("payload", "param"),
    [
        ({"name": "bad name", "path": "/adapters/a"}, "name"),
        ({"name": "fake", "path": "/adapters/a"}, "name"),  # the base model's own name
        ({"name": "team-a", "path": ""}, "path"),
        ({"name": "team-a"}, "path"),
        ({"name": "team-a", "path": "/adapters/a", "rank": 8}, "rank"),
    ],
)
def test_bad_bodies_name_the_field(
    make_gateway: GatewayFactory,
    engines: tuple[FakeUpstream, FakeUpstream],
    tmp_path: Path,
    payload: dict[str, object],
    param: str,
) -> None:
    gateway = gateway_for(make_gateway, engines, tmp_path / "keys.db")
    with _admin(gateway) as admin:
        response = admin.post(PATH, json=payload)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param


def test_tenant_keys_reach_neither_the_admin_routes_nor_vllms(
    make_gateway: GatewayFactory, engines: tuple[FakeUpstream, FakeUpstream], tmp_path: Path
) -> None:
    gateway = gateway_for(make_gateway, engines, tmp_path / "keys.db")
    with http_client(gateway.url, key=TEST_KEY) as tenant:
        assert tenant.post(PATH, json={"name": "x", "path": "/adapters/x"}).status_code == 401
        direct = tenant.post("/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": "/a"})
        assert direct.status_code == 403
    assert all(engine.adapters == {} for engine in engines)


def test_replicas_sharing_redis_share_the_adapters(
    make_gateway: GatewayFactory,
    engines: tuple[FakeUpstream, FakeUpstream],
    redis_server: RedisServer,
    tmp_path: Path,
) -> None:
    redis_server.flush()
    upstream = ",".join(engine.url for engine in engines)
    replicas = [
        make_gateway(
            upstream=upstream,
            keys_db=str(tmp_path / f"keys-{index}.db"),  # separate files: only Redis is shared
            redis_url=redis_server.url,
            admin_keys=(ADMIN,),
            runtime_adapters=True,
            health_interval_s=0.2,
        )
        for index in range(2)
    ]
    with _admin(replicas[0]) as admin:
        assert admin.post(PATH, json={"name": "team-a", "path": "/adapters/a"}).status_code == 200
    with _admin(replicas[1]) as other:
        listed = other.get(PATH).json()["data"]
    assert [(entry["name"], entry["state"]) for entry in listed] == [("team-a", "loaded")]
    assert eventually(lambda: "team-a" in _models(replicas[1]))
    # an engine that restarts gets it back from whichever replica's round comes first
    engines[0].adapters = {}
    assert eventually(lambda: engines[0].adapters == {"team-a": "fake"}, timeout=10)
