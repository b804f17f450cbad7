"""Streaming through the proxy: SSE relayed as it arrives, disconnects, mid-stream failures."""

from __future__ import annotations

import concurrent.futures
import json
import socket

import httpx
import pytest

from tests.gateway.conftest import GatewayFactory
from tests.gateway.fake_upstream import FakeUpstream
from tests.gateway.servers import TEST_KEY, GatewayServer, http_client

pytestmark = pytest.mark.timeout(30)

STREAM = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def client(gateway: GatewayServer, timeout: float = 10) -> httpx.Client:
    return http_client(gateway.url, timeout=timeout)


def sse_events(raw: bytes) -> list[str]:
    """The `data:` payloads of a server-sent event stream, in order."""
    events = []
    for block in raw.decode().split("\n\n"):
        lines = [line[len("data: ") :] for line in block.split("\n") if line.startswith("data: ")]
        if lines:
            events.append("\n".join(lines))
    return events


# -- streaming ---------------------------------------------------------------------------


def test_sse_arrives_in_several_chunks(gateway: GatewayServer) -> None:
    chunks: list[bytes] = []
    with (
        client(gateway) as http,
        http.stream("POST", "/v1/chat/completions", json=STREAM) as response,
    ):
        assert response.headers["content-type"] == "text/event-stream"
        assert "content-length" not in response.headers
        chunks.extend(response.iter_raw())
    events = sse_events(b"".join(chunks))
    assert len(chunks) >= 2  # 4 upstream pauses of 20 ms; buffering gives 1
    assert events[-1] == "[DONE]"
    assert len(events) == 6


def test_sse_is_not_buffered(gateway: GatewayServer, upstream: FakeUpstream, token: str) -> None:
    with (
        client(gateway, timeout=2) as http,
        http.stream("POST", f"/v1/gated-stream?t={token}", json={"stream": True}) as response,
    ):
        raw = response.iter_raw()
        first = next(raw)
        # The upstream is still waiting on its gate: the gateway relayed the first event
        # without waiting for the rest.
        assert not upstream.seen(f"{token}:finished")
        assert sse_events(first) == [sse_events(first)[0]]
        assert '"first"' in first.decode()
        upstream.release(token)
        rest = b"".join(raw)
    assert sse_events(first + rest)[-1] == "[DONE]"
    assert upstream.wait_for(f"{token}:finished", 2)


def test_client_disconnect_mid_stream_closes_upstream(
    gateway: GatewayServer, upstream: FakeUpstream, token: str
) -> None:
    with (
        client(gateway) as http,
        http.stream("POST", f"/v1/gated-stream?t={token}", json={"stream": True}) as response,
    ):
        next(response.iter_raw())
    # Leaving the block closed the unfinished response, hence its connection.
    assert upstream.wait_for(f"{token}:cancelled", 1.0)
    assert not upstream.seen(f"{token}:finished")


def test_client_disconnect_before_headers_closes_upstream(
    gateway: GatewayServer, upstream: FakeUpstream, token: str
) -> None:
    request = (
        f"POST /v1/hang?t={token} HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {TEST_KEY}\r\n"
        "Content-Length: 2\r\n\r\n{}"
    ).encode()
    with socket.create_connection(("127.0.0.1", gateway.port)) as sock:
        sock.sendall(request)
        assert upstream.wait_for(f"{token}:started", 2)
    assert upstream.wait_for(f"{token}:cancelled", 1.0)


# -- failures mid-stream -----------------------------------------------------------


def test_upstream_idle_mid_stream_ends_with_error_event(make_gateway: GatewayFactory) -> None:
    gateway = make_gateway(upstream_idle_timeout_s=0.3)
    with client(gateway) as http:
        response = http.post("/v1/hang-mid-stream", json={"stream": True})
    assert response.status_code == 200
    events = sse_events(response.content)
    assert len(events) == 2
    assert json.loads(events[0])["object"] == "chat.completion.chunk"
    assert json.loads(events[-1])["error"]["type"] == "timeout"


def test_upstream_reset_mid_stream_ends_with_error_event(gateway: GatewayServer) -> None:
    with client(gateway) as http:
        response = http.post("/v1/reset-mid-stream", json={"stream": True})
    events = sse_events(response.content)
    assert "[DONE]" not in events
    assert [json.loads(event).get("object") for event in events[:2]] == [
        "chat.completion.chunk"
    ] * 2
    error = json.loads(events[-1])["error"]
    assert (error["type"], error["code"]) == ("server_error", "upstream_error")


def test_upstream_reset_mid_plain_body_truncates_client_response(gateway: GatewayServer) -> None:
    received: list[bytes] = []
    with client(gateway) as http, http.stream("GET", "/v1/reset-mid-chunked") as response:
        assert response.status_code == 200
        with pytest.raises(httpx.RemoteProtocolError):
            received.extend(response.iter_raw())
    assert b"".join(received) == b"partial body"


def test_concurrent_streams_all_complete(gateway: GatewayServer) -> None:
    with client(gateway) as http, concurrent.futures.ThreadPoolExecutor(16) as pool:

        def one(_: int) -> list[str]:
            return sse_events(http.post("/v1/chat/completions", json=STREAM).content)

        results = list(pool.map(one, range(16)))
    assert all(events[-1] == "[DONE]" and len(events) == 6 for events in results)
