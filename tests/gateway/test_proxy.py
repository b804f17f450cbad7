"""The proxy over real sockets: passthrough and upstream errors (streaming: next module)."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from serving.gateway.errors import (
    UpstreamUnavailableError,
    openai_error_body,
    wrap_upstream_status,
)
from serving.gateway.proxy import WHOLE_BODY_LIMIT, Proxy, ProxyOutcome, ProxyRequest
from serving.gateway.routing import Router
from tests.gateway.conftest import GatewayFactory
from tests.gateway.fake_bodies import VLLM_400
from tests.gateway.fake_upstream import FakeUpstream
from tests.gateway.servers import TEST_KEY, GatewayServer, closed_port, http_client

pytestmark = pytest.mark.timeout(30)


def client(gateway: GatewayServer, timeout: float = 10) -> httpx.Client:
    return http_client(gateway.url, timeout=timeout)


def direct(upstream: FakeUpstream, path: str) -> httpx.Response:
    with http_client(upstream.url, key=None) as http:
        return http.get(path)


def error_of(response: httpx.Response) -> dict[str, object]:
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert isinstance(error, dict)
    assert set(error) == {"message", "type", "param", "code"}
    return error


# -- passthrough -------------------------------------------------------------------------


def test_json_passthrough_is_byte_identical(gateway: GatewayServer, upstream: FakeUpstream) -> None:
    upstream_response = direct(upstream, "/v1/small-json")
    with client(gateway) as http:
        response = http.get("/v1/small-json")
    assert response.status_code == 200
    assert response.content == upstream_response.content
    assert response.headers["content-length"] == str(len(upstream_response.content))
    assert response.headers["content-type"] == upstream_response.headers["content-type"]


def test_method_path_query_and_body_are_forwarded(gateway: GatewayServer) -> None:
    with client(gateway) as http:
        response = http.put("/v1/echo?a=1&b=%2F%20x", content=b'{"k": "v"}')
    echoed = response.json()
    assert echoed["method"] == "PUT"
    assert echoed["path_qs"] == "/v1/echo?a=1&b=%2F%20x"
    assert echoed["body"] == '{"k": "v"}'


def test_request_headers_forwarded_without_credentials_or_hop_headers(
    gateway: GatewayServer, upstream: FakeUpstream
) -> None:
    headers = {
        "X-Custom": "yes",
        "X-Vllm-Priority": "-100",
        "X-data-parallel-rank": "1",
        "User-Agent": "OpenAI/Python 2.0",
        "Traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "Content-Type": "application/json",
        "Connection": "keep-alive, x-client-hop",
        "X-Client-Hop": "drop me",
        "Proxy-Authorization": "Basic c2VjcmV0",
        "TE": "trailers",
    }
    with client(gateway) as http:
        response = http.post("/v1/echo", content=b"{}", headers=headers)
    forwarded = dict(response.json()["headers"])
    assert forwarded["content-type"] == "application/json"
    assert forwarded["user-agent"] == "OpenAI/Python 2.0"
    assert forwarded["traceparent"] == headers["Traceparent"]
    assert forwarded["host"] == upstream.url.removeprefix("http://")
    # Only the route table's allow-list passes: vLLM's own control headers never do.
    dropped = ("authorization", "proxy-authorization", "x-client-hop", "te", "x-custom")
    for name in (*dropped, "x-vllm-priority", "x-data-parallel-rank"):
        assert name not in forwarded
    assert TEST_KEY not in response.text
    # The upstream sees the same request id the client gets back.
    assert forwarded["x-request-id"] == response.headers["x-request-id"]


def test_hop_by_hop_response_headers_are_dropped(
    gateway: GatewayServer, upstream: FakeUpstream
) -> None:
    upstream_response = direct(upstream, "/v1/echo")
    # The fake really sends them, so their absence below is the gateway's doing.
    for name in ("connection", "keep-alive", "proxy-authenticate", "x-hop-named"):
        assert name in upstream_response.headers
    with client(gateway) as http:
        response = http.get("/v1/echo")
    assert response.headers["x-custom"] == "kept"
    for name in ("keep-alive", "proxy-authenticate", "x-hop-named"):
        assert name not in response.headers
    assert response.headers.get("connection", "keep-alive") == "keep-alive"
    assert response.headers["x-request-id"] != "upstream-id"
    assert "server" not in response.headers  # neither vLLM's nor uvicorn's


def test_large_body_streams_through_complete(
    gateway: GatewayServer, upstream: FakeUpstream
) -> None:
    upstream_response = direct(upstream, "/v1/big-json")
    assert len(upstream_response.content) > WHOLE_BODY_LIMIT
    with client(gateway) as http:
        response = http.get("/v1/big-json")
    assert response.content == upstream_response.content
    assert "content-length" not in response.headers


def test_request_id_echoed_when_sane_and_replaced_otherwise(gateway: GatewayServer) -> None:
    with client(gateway) as http:
        sane = http.get("/v1/echo", headers={"X-Request-Id": "client-id.42"})
        insane = http.get("/v1/echo", headers={"X-Request-Id": "has spaces and ; stuff"})
        missing = http.get("/v1/models")
    assert sane.headers["x-request-id"] == "client-id.42"
    assert dict(sane.json()["headers"])["x-request-id"] == "client-id.42"
    assert insane.headers["x-request-id"] != "has spaces and ; stuff"
    assert len(insane.headers["x-request-id"]) == 32
    assert len(missing.headers["x-request-id"]) == 32


# -- upstream errors ---------------------------------------------------------------------


def test_upstream_openai_error_passes_through(gateway: GatewayServer) -> None:
    with client(gateway) as http:
        response = http.post("/v1/bad-request", json={"max_tokens": -1})
    assert response.status_code == 400
    assert response.json() == VLLM_400
    assert "x-request-id" in response.headers


def test_upstream_flat_vllm_error_is_nested(gateway: GatewayServer) -> None:
    with client(gateway) as http:
        response = http.get("/v1/legacy-error")
    assert response.status_code == 400
    assert error_of(response) == {
        "message": "bad",
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }


def test_upstream_html_500_is_wrapped_as_502(gateway: GatewayServer) -> None:
    with client(gateway) as http:
        response = http.get("/v1/html-500")
    assert response.status_code == 502
    error = error_of(response)
    assert (error["type"], error["code"]) == ("server_error", "upstream_error")
    assert "10.0.0.7" not in response.text  # upstream internals are not echoed


def test_upstream_plain_4xx_keeps_its_status(gateway: GatewayServer) -> None:
    with client(gateway) as http:
        response = http.get("/v1/detail-404")
    assert response.status_code == 404
    error = error_of(response)
    assert (error["type"], error["message"]) == ("invalid_request_error", "Not Found")


def test_upstream_down_is_503_with_retry_after(make_gateway: GatewayFactory) -> None:
    gateway = make_gateway(upstream=f"http://127.0.0.1:{closed_port()}", retry_after_s=3)
    with client(gateway) as http:
        response = http.get("/v1/models")
    assert response.status_code == 503
    assert response.headers["retry-after"] == "3"
    error = error_of(response)
    assert (error["type"], error["code"]) == ("server_error", "upstream_unavailable")


def test_upstream_reset_before_headers_is_502(gateway: GatewayServer) -> None:
    with client(gateway) as http:
        response = http.post("/v1/reset-before-headers", json={})
    assert response.status_code == 502
    assert error_of(response)["code"] == "upstream_error"


def test_upstream_idle_before_headers_is_504(make_gateway: GatewayFactory, token: str) -> None:
    gateway = make_gateway(upstream_idle_timeout_s=0.3)
    started = time.monotonic()
    with client(gateway) as http:
        response = http.post(f"/v1/hang?t={token}", json={})
    elapsed = time.monotonic() - started
    assert response.status_code == 504
    assert error_of(response)["type"] == "timeout"
    assert 0.3 <= elapsed < 3


# -- pure helpers ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"error": {"message": "m", "type": "t"}}', b'{"error": {"message": "m", "type": "t"}}'),
        (
            b'{"object": "error", "message": "m", "type": "t", "code": 400}',
            b'{"error":{"message":"m","type":"t","param":null,"code":400}}',
        ),
        (b'{"error": "just a string"}', None),
        (b'{"detail": "Not Found"}', None),
        (b"[1, 2]", None),
        (b"<html></html>", None),
        (b"\xff\xfe", None),
    ],
)
def test_openai_error_body(body: bytes, expected: bytes | None) -> None:
    assert openai_error_body(body) == expected


def test_wrap_upstream_status() -> None:
    assert wrap_upstream_status(503, b"").http_status == 502
    rejected = wrap_upstream_status(422, b'{"detail": [{"loc": ["body"]}]}')
    assert rejected.http_status == 422
    assert rejected.type == "invalid_request_error"
    assert "422" in rejected.message


def test_the_proxy_raises_its_failures_and_writes_no_error_itself() -> None:
    """The proxy relays bytes and reports; the app's error boundary answers a failure."""
    sent: list[object] = []

    async def send(message: object) -> None:
        sent.append(message)

    async def receive() -> dict[str, object]:
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    proxy = Proxy(Router([], policy="round-robin", overload=8), retry_after_s=2)
    outcome = ProxyOutcome()
    request = ProxyRequest("GET", b"/v1/models", [], b"", b"rid")
    with pytest.raises(UpstreamUnavailableError) as raised:
        asyncio.run(proxy.forward(request, receive, send, outcome))
    assert outcome.error is raised.value
    assert (sent, outcome.status) == ([], 0)
