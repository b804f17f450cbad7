"""Hostile clients (docs/architecture.md, reliability case 16) and the gateway idle after any mix.

Oversized and deeply nested requests are answered 413/400 before any quota is touched (slow
clients and shutting down: `test_server`).
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from serving.gateway.keys import SqliteKeyStore
from serving.gateway.keys.record import KeySpec
from serving.gateway.quota import Limits
from tests.gateway.conftest import GatewayFactory
from tests.gateway.fake_upstream import FakeUpstream
from tests.gateway.scrape import key_usage, settled
from tests.gateway.servers import GatewayServer, http_client

pytestmark = pytest.mark.timeout(30)

REPO = Path(__file__).resolve().parents[2]
GATED = {
    "model": "gated",
    "messages": [{"role": "user", "content": "hi"}],
    "stream": True,
    "max_tokens": 5,
}


def test_oversized_and_nested_bodies_are_refused_before_quota(
    strict: GatewayServer, keys: SqliteKeyStore, upstream: FakeUpstream, token: str
) -> None:
    record, secret = keys.create(KeySpec("t", limits=Limits(rpm=1)))
    with http_client(strict.url, key=secret) as http:
        big = http.post(f"/v1/chat/completions?t={token}", content=b"{" + b" " * 2000 + b"}")
        nested = http.post(f"/v1/chat/completions?t={token}", content=b"[" * 400 + b"]" * 400)
        chunked = http.post(
            f"/v1/chat/completions?t={token}", content=iter([b"{" * 600, b"}" * 600])
        )
    assert big.status_code == 413 and chunked.status_code == 413
    assert big.json()["error"]["code"] == "request_too_large"
    assert nested.status_code == 400
    assert "x-ratelimit-limit-requests" in big.headers
    assert key_usage(strict, record.key_id) == (0, 0, 0, 0)
    assert not upstream.seen(f"{token}:started")


def test_deep_nesting_beyond_the_parser_is_400(
    make_gateway: GatewayFactory, keys: SqliteKeyStore
) -> None:
    gateway = make_gateway(keys_db=str(keys.path))
    record, secret = keys.create(KeySpec("t", limits=Limits(rpm=1)))
    with http_client(gateway.url, key=secret) as http:
        response = http.post("/v1/chat/completions", content=b"[" * 200_000 + b"]" * 200_000)
    assert response.status_code == 400
    assert "nested too deeply" in response.json()["error"]["message"]
    assert key_usage(gateway, record.key_id) == (0, 0, 0, 0)


def test_gateway_is_idle_after_a_mix_of_failures(
    strict: GatewayServer, keys: SqliteKeyStore
) -> None:
    _, secret = keys.create(KeySpec("t", limits=Limits(max_concurrency=2, tpm=100_000)))
    with http_client(strict.url, key=secret) as http:
        for model in ("fake", "fault-reset", "fault-garbage", "fault-500", "fault-in-band"):
            for stream in (False, True):
                http.post(
                    "/v1/chat/completions",
                    json={**GATED, "model": model, "stream": stream},
                )
        http.post("/v1/chat/completions", content=b"{")
    assert settled(strict)


def _large_request_head(gateway: GatewayServer, secret: str, length: int) -> bytes:
    """The answer to a metered request whose head announces `length` bytes of body, of which
    only a few are ever sent: it can only come before the body was read."""
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Authorization: Bearer %s\r\nContent-Length: %d\r\n\r\n{"model":'
            % (secret.encode(), length)
        )
        answer = b""
        while b"\r\n\r\n" not in answer:
            data = sock.recv(65536)
            if not data:
                break
            answer += data
    return answer


def test_a_key_at_its_request_limits_is_refused_before_its_large_body_is_read(
    make_gateway: GatewayFactory, keys: SqliteKeyStore
) -> None:
    gateway = make_gateway(keys_db=str(keys.path), body_timeout_s=30)
    _, secret = keys.create(KeySpec("busy", limits=Limits(rpm=1)))
    with http_client(gateway.url, key=secret) as http:
        body = {"model": "fake", "messages": [{"role": "user", "content": "hi"}]}
        assert http.post("/v1/chat/completions", json=body).status_code == 200
    head = _large_request_head(gateway, secret, 5_000_000)
    assert head.startswith(b"HTTP/1.1 429"), head
    assert b"retry-after" in head.lower()
    # a small body is simply parsed and refused by the reservation, as before
    with http_client(gateway.url, key=secret) as http:
        assert http.post("/v1/chat/completions", json=body).status_code == 429
