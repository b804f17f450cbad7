"""The gateway with its quota counters in Redis (docs/architecture.md, reliability case 11),
over HTTP: limits hold in Redis; while Redis is black-holed a request gets the policy's answer
within the time bound, /readyz and the metrics say so; once Redis is back, a stream that ended
meanwhile is settled by id, charged once, and nothing is left held.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from serving.gateway.keys import SqliteKeyStore
from serving.gateway.keys.record import KeySpec
from serving.gateway.quota import Limits
from tests.gateway.conftest import GatewayFactory, eventually
from tests.gateway.fake_upstream import FakeUpstream
from tests.gateway.quota.redis_server import RedisServer
from tests.gateway.scrape import key_usage, scrape, settled, value
from tests.gateway.servers import GatewayServer, http_client

pytestmark = pytest.mark.timeout(120)

CHAT = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
TIMEOUT_S = 0.5
# Well before redis-py's own 5 s socket timeout, with room for a busy machine.
BOUND_S = TIMEOUT_S + 3.0
# Generous: only bounds how long a broken test hangs, never waited out.
DEADLINE_S = 30.0


def redis_gateway(
    make_gateway: GatewayFactory, keys: SqliteKeyStore, server: RedisServer, policy: str
) -> GatewayServer:
    return make_gateway(
        keys_db=str(keys.path),
        redis_url=server.url,
        redis_timeout_s=TIMEOUT_S,
        redis_failure_policy=policy,
        redis_replicas=2,
        health_interval_s=0.2,  # lease upkeep, which probes Redis, runs this often too
    )


def readyz(gateway: GatewayServer) -> httpx.Response:
    with http_client(gateway.url, key=None) as http:
        return http.get("/readyz")


def charged(gateway: GatewayServer, key_id: str) -> float:
    """Tokens the gateway reports having charged the key (prompt and completion)."""
    samples = scrape(gateway)
    return sum(
        count
        for (name, labels), count in samples.items()
        if name == "gateway_tokens_total" and ("key", key_id) in labels
    )


def test_fail_closed_while_redis_is_black_holed_then_consistent_once_it_is_back(
    own_redis: RedisServer,  # first: torn down after the gateway, which writes to it on close
    make_gateway: GatewayFactory,
    keys: SqliteKeyStore,
    upstream: FakeUpstream,
    token: str,
) -> None:
    gateway = redis_gateway(make_gateway, keys, own_redis, "closed")
    record, secret = keys.create(KeySpec("shared", limits=Limits(rpm=100, max_concurrency=5)))
    with http_client(gateway.url, key=secret) as http:
        ok = http.post("/v1/chat/completions", json=CHAT)
        assert ok.status_code == 200 and ok.headers["x-ratelimit-remaining-requests"] == "99"
        assert readyz(gateway).status_code == 200
        stream = threading.Thread(
            target=http.post,
            args=(f"/v1/chat/completions?t={token}",),
            kwargs={"json": {**CHAT, "model": "gated", "stream": True}},
        )
        stream.start()
        assert upstream.wait_for(f"{token}:started", DEADLINE_S)
        own_redis.pause()
        try:
            started = time.monotonic()
            refused = http.post("/v1/chat/completions", json=CHAT)
            assert time.monotonic() - started < BOUND_S
            assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
            assert refused.json()["error"]["code"] == "quota_store_unavailable"
            assert refused.json()["error"]["type"] == "server_error"
            not_ready = readyz(gateway)
            assert not_ready.status_code == 503
            assert not_ready.json()["reason"] == "quota store unavailable"
            samples = scrape(gateway)
            assert value(samples, "gateway_quota_store_up") == 0
            assert value(samples, "gateway_quota_store_errors_total") >= 1
            upstream.release(token)  # the stream ends while Redis cannot hear of it
            stream.join(DEADLINE_S)
            assert not stream.is_alive()
        finally:
            own_redis.resume()
    assert eventually(lambda: readyz(gateway).status_code == 200, DEADLINE_S)
    assert value(scrape(gateway), "gateway_quota_store_up") == 1
    assert settled(gateway)  # the stream's lease ended in Redis: nothing held
    in_flight, requests, tokens, today = key_usage(gateway, record.key_id)
    assert in_flight == 0
    assert requests in (2, 3)  # the refused one's reservation, if it had arrived
    assert tokens == today == charged(gateway, record.key_id) > 0  # each charged once


def test_local_policy_serves_from_a_replicas_share_while_redis_is_black_holed(
    own_redis: RedisServer,  # first: torn down after the gateway, which writes to it on close
    make_gateway: GatewayFactory,
    keys: SqliteKeyStore,
) -> None:
    gateway = redis_gateway(make_gateway, keys, own_redis, "local")
    record, secret = keys.create(KeySpec("shared", limits=Limits(rpm=5)))
    own_redis.pause()
    try:
        with http_client(gateway.url, key=secret) as http:
            statuses = []
            for _ in range(3):
                started = time.monotonic()
                statuses.append(http.post("/v1/chat/completions", json=CHAT).status_code)
                assert time.monotonic() - started < BOUND_S
        assert statuses == [200, 200, 429]  # rpm 5 shared by 2 replicas: 2 each
        ready = readyz(gateway)
        assert ready.status_code == 200
        assert ready.json()["quota_store"] == "unavailable: local limits apply"
        assert value(scrape(gateway), "gateway_quota_store_up") == 0
    finally:
        own_redis.resume()
    assert eventually(lambda: "quota_store" not in readyz(gateway).json(), DEADLINE_S)
    assert settled(gateway)
    with http_client(gateway.url, key=secret) as http:
        again = http.post("/v1/chat/completions", json=CHAT)
    assert again.status_code == 200 and again.headers["x-ratelimit-limit-requests"] == "5"
    assert key_usage(gateway, record.key_id)[:2] == (0, 1)  # Redis counts what it saw


@pytest.mark.parametrize(
    "absurd",
    [
        {"n": 10_000_000_000_000_000_000},
        {"max_tokens": 10_000_000_000_000_000_000},
        {"n": 128, "max_tokens": 2**31},
        {"n": -1},
        {"max_tokens": 2.5},
    ],
)
def test_an_absurd_body_is_a_400_that_never_locks_its_key_out(
    make_gateway: GatewayFactory,
    keys: SqliteKeyStore,
    redis_server: RedisServer,
    absurd: dict[str, object],
) -> None:
    # `n: 10**19` once made the reserve script fail half-way: a 503, and the key's two
    # slots never came back (every later request a 429).
    gateway = redis_gateway(make_gateway, keys, redis_server, "closed")
    _, secret = keys.create(KeySpec("absurd", limits=Limits(max_concurrency=2, tpm=10**6)))
    with http_client(gateway.url, key=secret) as http:
        for _ in range(3):
            refused = http.post("/v1/chat/completions", json={**CHAT, **absurd})
            assert refused.status_code in (400, 429), refused.text
            assert refused.json()["error"]["type"] in ("invalid_request_error", "tokens")
        for _ in range(3):
            assert http.post("/v1/chat/completions", json=CHAT).status_code == 200
    assert eventually(lambda: settled(gateway))


def test_a_body_withdrawn_after_admission_gives_back_its_request(
    make_gateway: GatewayFactory, keys: SqliteKeyStore, redis_server: RedisServer
) -> None:
    """A schema refused after the reservation ends the lease as withdrawn in Redis too:
    with rpm 1 the key still has its one request after three such 400s."""
    gateway = redis_gateway(make_gateway, keys, redis_server, "closed")
    record, secret = keys.create(KeySpec("withdrawn", limits=Limits(rpm=1, max_concurrency=1)))
    bad_tool = {"type": "function", "function": {"name": "f", "parameters": {"type": 1}}}
    with http_client(gateway.url, key=secret) as http:
        for _ in range(3):
            refused = http.post("/v1/chat/completions", json={**CHAT, "tools": [bad_tool]})
            assert refused.status_code == 400, refused.text
        assert http.post("/v1/chat/completions", json=CHAT).status_code == 200
        assert http.post("/v1/chat/completions", json=CHAT).status_code == 429
    assert eventually(lambda: settled(gateway))
    assert key_usage(gateway, record.key_id)[1] == 1
