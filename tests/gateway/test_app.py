"""Routing, auth in front of /v1, health endpoints and lifespan of the ASGI app."""

from __future__ import annotations

import asyncio
import http.client
import time

import httpx
import pytest

from serving.gateway.app import GatewayApp, create_app
from serving.gateway.settings import GatewaySettings
from serving.gateway.types import Message, Receive
from tests.gateway.conftest import GatewayFactory
from tests.gateway.fake_upstream import FakeUpstream
from tests.gateway.servers import OTHER_KEY, TEST_KEY, GatewayServer, closed_port, http_client

pytestmark = pytest.mark.timeout(30)


# -- auth --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "",
        "Bearer",
        f"Bearer\t{TEST_KEY}",
        f"Basic {TEST_KEY}",
        f"Token {TEST_KEY}",
        f"Bearer {TEST_KEY}x",
        f"Bearer {TEST_KEY} extra",
        f"Bearer {OTHER_KEY}",
        TEST_KEY,
    ],
)
def test_bad_keys_get_identical_401s(
    gateway: GatewayServer, upstream: FakeUpstream, token: str, authorization: str | None
) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    with http_client(gateway.url, key=None) as http:
        response = http.post(f"/v1/echo?t={token}", json={}, headers=headers)
    assert response.status_code == 401
    assert response.json() == {
        "error": {
            "message": "Invalid API key. Send a valid key as 'Authorization: Bearer <key>'.",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }
    assert response.headers["www-authenticate"] == "Bearer"
    assert "x-request-id" in response.headers
    assert not upstream.seen(f"{token}:started")


def test_valid_key_passes_with_any_scheme_case(gateway: GatewayServer) -> None:
    with http_client(gateway.url, key=None) as http:
        response = http.get("/v1/models", headers={"Authorization": f"bearer {TEST_KEY}"})
    assert response.status_code == 200


# -- routes ------------------------------------------------------------------------------


def test_healthz_needs_no_key_and_no_upstream(make_gateway: GatewayFactory) -> None:
    gateway = make_gateway(upstream=f"http://127.0.0.1:{closed_port()}")
    with http_client(gateway.url, key=None) as http:
        response = http.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}
    assert "x-request-id" in response.headers


def test_readyz_follows_the_health_monitor(
    make_gateway: GatewayFactory, upstream: FakeUpstream
) -> None:
    gateway = make_gateway(health_interval_s=0.05)
    with http_client(gateway.url, key=None) as http:
        assert http.get("/readyz").status_code == 200
        upstream.healthy = False
        try:
            failing = wait_for_status(http, "/readyz", 503)
        finally:
            upstream.healthy = True
        wait_for_status(http, "/readyz", 200)
    assert failing.json()["reason"] == "upstream /health answered 503"
    assert failing.headers["retry-after"] == "1"


def test_readyz_never_calls_the_upstream(make_gateway: GatewayFactory) -> None:
    """/readyz needs no key: if it probed vLLM, anyone could multiply the engine's load."""
    own = FakeUpstream()  # no other gateway checks this one's health
    own.start()
    try:
        gateway = make_gateway(upstream=own.url, health_interval_s=3600)  # no check meanwhile
        before = own.health_checks
        with http_client(gateway.url, key=None) as http:
            answers = {http.get("/readyz").status_code for _ in range(20)}
        assert answers == {200}
        assert before == 1  # the one check at startup
        assert own.health_checks == before
    finally:
        own.stop()


def wait_for_status(http: httpx.Client, path: str, status: int) -> httpx.Response:
    deadline = time.monotonic() + 20
    while True:
        response = http.get(path)
        if response.status_code == status or time.monotonic() > deadline:
            assert response.status_code == status
            return response
        time.sleep(0.05)


def test_readyz_503_when_upstream_unreachable(make_gateway: GatewayFactory) -> None:
    gateway = make_gateway(upstream=f"http://127.0.0.1:{closed_port()}")
    with http_client(gateway.url, key=None) as http:
        response = http.get("/readyz")
    assert response.status_code == 503
    assert response.json()["status"] == "unavailable"


@pytest.mark.parametrize("path", ["/", "/v2/models", "/v1", "/metric", "/healthy", "/v1/nothing"])
def test_unknown_routes_are_openai_404s(gateway: GatewayServer, path: str) -> None:
    with http_client(gateway.url) as http:
        response = http.get(path)
    assert response.status_code == 404
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "unknown_url")
    assert error["message"] == f"Invalid URL (GET {path})"


@pytest.mark.parametrize("path", ["/v1/../health", "/v1/%2e%2e/health", "/v1/./models"])
def test_dot_segments_are_not_forwarded(gateway: GatewayServer, path: str) -> None:
    # http.client sends the path as written (httpx would normalise it first).
    connection = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=5)
    try:
        connection.request("GET", path, headers={"Authorization": f"Bearer {TEST_KEY}"})
        response = connection.getresponse()
        assert response.status == 404
        response.read()
    finally:
        connection.close()


def test_body_over_limit_is_413_before_forwarding(
    make_gateway: GatewayFactory, upstream: FakeUpstream, token: str
) -> None:
    gateway = make_gateway(max_body_bytes=100)
    with http_client(gateway.url) as http:
        declared = http.post(f"/v1/echo?t={token}", content=b"x" * 101)
        chunked = http.post(f"/v1/echo?t={token}", content=iter([b"x" * 60, b"x" * 60]))
        fits = http.post("/v1/echo", content=iter([b"x" * 50, b"x" * 50]))
    for response in (declared, chunked):
        assert response.status_code == 413
        assert response.json()["error"]["code"] == "request_too_large"
    assert not upstream.seen(f"{token}:started")
    assert fits.json()["body"] == "x" * 100


# -- pieces, without a server -----------------------------------------------------------


def receiver(*messages: Message) -> tuple[list[Message], Receive]:
    queue = list(messages)

    async def receive() -> Message:
        return queue.pop(0)

    return queue, receive


def test_lifespan_opens_and_closes_the_upstream_session() -> None:
    settings = GatewaySettings.create(upstream="http://127.0.0.1:9", api_keys=[TEST_KEY])
    app = create_app(settings)
    assert isinstance(app, GatewayApp)
    sent: list[Message] = []

    async def scenario() -> None:
        queue, receive = receiver({"type": "lifespan.startup"}, {"type": "lifespan.shutdown"})

        async def send(message: Message) -> None:
            sent.append(message)
            if message["type"] == "lifespan.startup.complete":
                assert not app.router.engines[0].client.session.closed

        await app({"type": "lifespan"}, receive, send)
        assert queue == []

    asyncio.run(scenario())
    assert [m["type"] for m in sent] == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    with pytest.raises(RuntimeError, match="lifespan"):
        _ = app.router.engines[0].client.session


# -- paths vLLM would redirect -------------------------------------------------------------


def test_an_upstream_redirect_to_itself_reaches_the_client_relative(
    gateway: GatewayServer, upstream: FakeUpstream
) -> None:
    with http_client(gateway.url) as http:
        response = http.get("/v1/redirect-to-self")
    assert response.status_code == 307
    assert response.headers["location"] == "/v1/models?x=1"
    assert str(upstream.port) not in response.text + str(response.headers)
