"""The route table: what each path is served as, and the answer for every other path."""

from __future__ import annotations

import re

import httpx
import pytest

from serving.gateway.anthropic_errors import ANTHROPIC
from serving.gateway.api_dialect import OPENAI
from serving.gateway.errors import EndpointNotAllowedError, GatewayError, RouteNotFoundError
from serving.gateway.route_table import REFUSED, ROUTES, UPSTREAM_HEADERS, dialect_of
from tests.gateway.conftest import GatewayFactory
from tests.gateway.fake_upstream import FakeUpstream
from tests.gateway.servers import TEST_KEY, GatewayServer, closed_port, http_client


def refused(method: str, path: str, opt_in: frozenset[str] = frozenset()) -> GatewayError:
    with pytest.raises(GatewayError) as caught:
        ROUTES.lookup(method, path, opt_in=opt_in)
    return caught.value


@pytest.mark.parametrize(
    ("method", "path", "metering", "canonical"),
    [
        ("POST", "/v1/chat/completions", "chat", "/v1/chat/completions"),
        ("POST", "/v1/chat/completions/", "chat", "/v1/chat/completions"),
        ("POST", "/v1/completions", "completion", "/v1/completions"),
        ("POST", "/v1/responses", "responses", "/v1/responses"),
        ("POST", "/v1/responses/", "responses", "/v1/responses"),
        ("POST", "/v1/messages", "messages", "/v1/messages"),
        ("POST", "/v1/messages/", "messages", "/v1/messages"),
        ("POST", "/v1/messages/count_tokens", "free", "/v1/messages/count_tokens"),
        ("POST", "/v1/embeddings", "embeddings", "/v1/embeddings"),
        ("POST", "/v1/embeddings/", "embeddings", "/v1/embeddings"),
        ("POST", "/v1/score", "score", "/v1/score"),
        ("POST", "/v1/rerank", "rerank", "/v1/rerank"),
        ("POST", "/v2/rerank", "rerank", "/v2/rerank"),
        ("GET", "/v1/models", "models", "/v1/models"),
        ("GET", "/health", "health", "/health"),
        ("HEAD", "/health", "health", "/health"),
        ("POST", "/v1/files", "batches", "/v1/files"),
        ("GET", "/v1/files/file-abc/content", "batches", "/v1/files"),
        ("DELETE", "/v1/files/file-abc", "batches", "/v1/files"),
        ("GET", "/v1/batches", "batches", "/v1/batches"),
        ("POST", "/v1/batches/batch_abc/cancel", "batches", "/v1/batches"),
    ],
)
def test_served_routes(method: str, path: str, metering: str, canonical: str) -> None:
    route = ROUTES.lookup(method, path)
    assert (route.metering, route.path) == (metering, canonical)


def test_only_the_metered_routes_reserve() -> None:
    metered = {route.path for route in ROUTES.routes() if route.metered}
    assert metered == {
        "/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages",
        "/v1/embeddings", "/v1/score", "/v1/rerank", "/v2/rerank",
    }  # fmt: skip
    assert not set(REFUSED) & {route.path for route in ROUTES.routes()}


def vllm_routes() -> dict[str, type]:
    """Every path the installed vLLM's API routers declare, and its route's type."""
    import importlib
    import pkgutil

    import vllm.entrypoints
    from fastapi import APIRouter

    found: dict[str, type] = {}
    for module in pkgutil.walk_packages(vllm.entrypoints.__path__, "vllm.entrypoints."):
        if module.name.rsplit(".", 1)[-1] in ("api_router", "router", "api_server"):
            for value in vars(importlib.import_module(module.name)).values():
                if isinstance(value, APIRouter):
                    found.update(
                        (getattr(route, "path", ""), type(route)) for route in value.routes
                    )
    return found


def test_every_route_vllm_declares_is_served_or_refused_for_every_key() -> None:
    # A route a new vLLM adds fails here until the table serves or refuses it; refusals
    # come before the key is read, so they hold for every key alike.
    from fastapi.routing import APIWebSocketRoute

    routes = vllm_routes()
    assert {"/v1/chat/completions", "/v1/embeddings", "/v2/rerank", "/pooling"} <= set(routes)
    served = {route.path for route in ROUTES.routes()}
    for path, kind in routes.items():
        if path in served or kind is APIWebSocketRoute:  # the gateway serves HTTP only
            continue
        concrete = re.sub(r"\{[^}]+\}", "x", path)
        assert isinstance(refused("POST", concrete), EndpointNotAllowedError), path


@pytest.mark.parametrize("path", ["/score", "/rerank", "/v2/embed", "/pooling", "/classify"])
def test_pooling_routes_not_metered_stay_refused(path: str) -> None:
    # /score and /rerank are the same APIs as /v1/score and /v1/rerank: one path per API.
    error = refused("POST", path)
    assert isinstance(error, EndpointNotAllowedError) and error.http_status == 403


@pytest.mark.parametrize("path", sorted(REFUSED))
def test_vllms_other_routes_are_403s_that_say_why(path: str) -> None:
    error = refused("POST", path)
    assert isinstance(error, EndpointNotAllowedError)
    assert error.http_status == 403 and path in error.message


@pytest.mark.parametrize(
    "path", ["/v1/responses/resp_123", "/v1/responses/resp_123/cancel", "/v1/messages/"]
)
def test_stored_responses_and_variants_are_refused(path: str) -> None:
    assert refused("GET", path).http_status == 403


@pytest.mark.parametrize(
    "path",
    ["/v1/nothing", "/v2/models", "/", "/tokenizer", "/v1/chat", "/v1/filesx", "/v2/files/x"],
)
def test_unknown_paths_are_404s(path: str) -> None:
    assert isinstance(refused("POST", path), RouteNotFoundError)


def test_a_served_path_with_another_method_is_refused() -> None:
    error = refused("GET", "/v1/chat/completions")
    assert error.http_status == 403 and "POST only" in error.message
    assert refused("POST", "/v1/models").http_status == 403


def test_tokenize_is_served_only_when_opted_in() -> None:
    assert isinstance(refused("POST", "/tokenize"), RouteNotFoundError)
    route = ROUTES.lookup("POST", "/tokenize", opt_in=frozenset({"tokenize"}))
    assert route.metering == "free" and route.metered is None


@pytest.mark.parametrize(
    ("path", "anthropic"),
    [
        ("/v1/messages", True),
        ("/v1/messages/", True),
        ("/v1/messages/count_tokens", True),
        ("/v1/messages/render", True),
        ("/v1/messagesx", False),
        ("/v1/chat/completions", False),
        ("/v1/responses", False),
    ],
)
def test_anthropics_paths_speak_its_dialect(path: str, anthropic: bool) -> None:
    assert (dialect_of(path) is ANTHROPIC) is anthropic
    assert (dialect_of(path) is OPENAI) is not anthropic


def test_messages_render_stays_refused() -> None:
    assert isinstance(refused("POST", "/v1/messages/render"), EndpointNotAllowedError)


def test_no_control_header_of_vllm_is_forwarded() -> None:
    assert not [name for name in UPSTREAM_HEADERS if name.startswith((b"x-vllm", b"x-data"))]
    assert b"authorization" not in UPSTREAM_HEADERS
    assert b"x-api-key" not in UPSTREAM_HEADERS


# -- through the gateway ------------------------------------------------------------------


def test_health_answers_as_vllms_does_without_a_key(gateway: GatewayServer) -> None:
    with httpx.Client(base_url=gateway.url, timeout=5) as http:
        response = http.get("/health")
        head = http.head("/health")
    assert (response.status_code, response.content) == (200, b"")
    assert head.status_code == 200


def test_health_is_503_while_no_engine_is_healthy(make_gateway: GatewayFactory) -> None:
    gateway = make_gateway(upstream=f"http://127.0.0.1:{closed_port()}")
    with httpx.Client(base_url=gateway.url, timeout=5) as http:
        assert http.get("/health").status_code == 503


def test_refusals_come_before_the_key_is_checked_and_reach_no_engine(
    gateway: GatewayServer, upstream: FakeUpstream
) -> None:
    before = upstream.requests_seen()
    with http_client(gateway.url, key=None) as http:
        assert http.post("/v1/messages/render", json={}).status_code == 403
        assert http.post("/v1/load_lora_adapter", json={}).status_code == 403
        assert http.get("/version").status_code == 403
    with http_client(gateway.url, key=TEST_KEY) as http:
        assert http.post("/v1/chat/completions/batch", json={}).status_code == 403
        assert http.get("/v1/responses/resp_1").status_code == 403
    assert upstream.requests_seen() == before


def test_tokenize_opted_in_reaches_vllm_and_checks_media(
    make_gateway: GatewayFactory, upstream: FakeUpstream
) -> None:
    gateway = make_gateway(serve_routes=("tokenize",))
    remote = {"type": "image_url", "image_url": {"url": "http://169.254.169.254/x.png"}}
    body = {"model": "fake", "messages": [{"role": "user", "content": [remote]}]}
    with http_client(gateway.url, key=TEST_KEY) as http:
        response = http.post("/tokenize", json=body)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == "messages[0].content[0].image_url.url"
        template = http.post(
            "/tokenize", json={"model": "fake", "messages": [], "chat_template": "x"}
        )
        assert template.json()["error"]["param"] == "chat_template"
