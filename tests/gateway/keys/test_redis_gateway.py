"""Two gateways sharing one Redis (as replicas do) and the keys `serving keys --redis-url`
writes there: a key works on both, from startup or within a refresh of its creation, and a
revoked one gets the same 401 as an unknown key on both within a refresh. A gateway that
cannot load the keys at startup starts unready, and is ready once they load."""

from __future__ import annotations

import re
from collections.abc import Callable

import httpx
import pytest

from serving import cli
from tests.gateway.conftest import GatewayFactory, eventually
from tests.gateway.quota.redis_server import RedisServer
from tests.gateway.servers import TEST_KEY, GatewayServer, http_client

pytestmark = pytest.mark.timeout(120)

CHAT = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
SECRET = re.compile(r"sk-[0-9a-f]{8}-[A-Za-z0-9]{40}")
# Generous: only bounds how long a broken test hangs, never waited out (a refresh is 1 s).
DEADLINE_S = 30.0


def create_key(capsys: pytest.CaptureFixture[str], url: str, name: str) -> tuple[str, str]:
    assert cli.main(["keys", "create", "--redis-url", url, "--name", name, "--rpm", "100"]) == 0
    (secret,) = SECRET.findall(capsys.readouterr().out)
    return "key_" + secret[3:11], secret


def chat(gateway: GatewayServer, secret: str) -> httpx.Response:
    with http_client(gateway.url, key=secret) as http:
        return http.post("/v1/chat/completions", json=CHAT)


def answers(gateway: GatewayServer, secret: str, status: int) -> Callable[[], bool]:
    return lambda: chat(gateway, secret).status_code == status


def test_a_key_in_redis_works_on_every_replica_until_it_is_revoked(
    make_gateway: GatewayFactory, default_namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = default_namespace
    early_id, early = create_key(capsys, url, "before-start")
    replicas = [make_gateway(redis_url=url) for _ in range(2)]
    for gateway in replicas:
        assert chat(gateway, early).status_code == 200  # loaded at startup: no wait
    late_id, late = create_key(capsys, url, "after-start")
    for gateway in replicas:
        assert eventually(answers(gateway, late, 200), DEADLINE_S)

    unknown = chat(replicas[0], "sk-00000000-" + "a" * 40)
    assert unknown.status_code == 401
    for key_id in (early_id, late_id):
        assert cli.main(["keys", "revoke", key_id, "--redis-url", url]) == 0
    for gateway in replicas:
        for secret in (early, late):
            assert eventually(answers(gateway, secret, 401), DEADLINE_S)
            assert chat(gateway, secret).json() == unknown.json()  # no tell for revoked
        assert chat(gateway, TEST_KEY).status_code == 200  # the other key sources still work


def test_a_gateway_that_cannot_load_the_keys_starts_unready_until_redis_answers(
    own_redis: RedisServer,  # first: torn down after the gateway, which writes to it on close
    make_gateway: GatewayFactory,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, secret = create_key(capsys, own_redis.url, "made-before")
    own_redis.stop()
    gateway = make_gateway(redis_url=own_redis.url)
    with http_client(gateway.url, key=None) as http:
        ready = http.get("/readyz")
    assert ready.status_code == 503
    assert ready.json()["reason"] == "API keys not loaded from Redis yet"
    assert chat(gateway, TEST_KEY).status_code != 401  # its other key sources work
    password = own_redis.url.split(":")[2].split("@")[0]
    logged = capsys.readouterr().err  # the gateway's log (uvicorn's handler, on stderr)
    assert "cannot load the API keys" in logged and password not in logged
    own_redis.start()  # comes back empty: create the key again
    _, secret = create_key(capsys, own_redis.url, "made-after")
    assert eventually(answers(gateway, secret, 200), DEADLINE_S)
    with http_client(gateway.url, key=None) as http:
        assert http.get("/readyz").status_code == 200
