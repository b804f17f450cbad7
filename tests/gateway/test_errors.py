"""The error tree: statuses, OpenAI shapes, and the one mapping of hop-client failures."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from serving.gateway.errors import (
    AuthenticationError,
    BodyTooLargeError,
    GatewayError,
    RouteNotFoundError,
    UpstreamError,
    UpstreamRejectedError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
    map_upstream_exception,
)
from tests.gateway.servers import closed_port


@pytest.mark.parametrize(
    ("error", "status", "kind", "code"),
    [
        (AuthenticationError(), 401, "invalid_request_error", "invalid_api_key"),
        (RouteNotFoundError("m"), 404, "invalid_request_error", "unknown_url"),
        (BodyTooLargeError("m"), 413, "invalid_request_error", "request_too_large"),
        (UpstreamRejectedError("m", status=422), 422, "invalid_request_error", None),
        (UpstreamError("m"), 502, "server_error", "upstream_error"),
        (UpstreamUnavailableError("m"), 503, "server_error", "upstream_unavailable"),
        (UpstreamTimeoutError("m"), 504, "timeout", "upstream_timeout"),
    ],
)
def test_statuses_and_shapes(error: GatewayError, status: int, kind: str, code: str | None) -> None:
    assert error.http_status == status
    body = json.loads(error.body())
    assert body == {"error": {"message": error.message, "type": kind, "param": None, "code": code}}


def test_sse_event_carries_the_same_error() -> None:
    error = UpstreamTimeoutError("idle")
    event = error.sse_event()
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    assert json.loads(event[len(b"data: ") :]) == json.loads(error.body())


def test_retry_after_header() -> None:
    assert UpstreamUnavailableError("m", retry_after_s=7).headers() == [(b"retry-after", b"7")]
    assert UpstreamError("m").headers() == []


def test_param_is_reported() -> None:
    assert json.loads(BodyTooLargeError("m", param="messages").body())["error"]["param"] == (
        "messages"
    )


async def _refused() -> Exception:
    async with aiohttp.ClientSession() as session:
        try:
            await session.get(f"http://127.0.0.1:{closed_port()}/")
        except aiohttp.ClientError as exc:
            return exc
    raise AssertionError("the request to a closed port succeeded")


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (aiohttp.ConnectionTimeoutError("connect"), UpstreamUnavailableError),
        (aiohttp.SocketTimeoutError("read"), UpstreamTimeoutError),
        (TimeoutError(), UpstreamTimeoutError),
        (aiohttp.ServerDisconnectedError(), UpstreamError),
        (aiohttp.ClientPayloadError("cut"), UpstreamError),
        (ConnectionResetError(), UpstreamError),
        (aiohttp.ClientResponseError(None, (), status=500), UpstreamError),  # type: ignore[arg-type]
    ],
)
def test_map_upstream_exception(exc: Exception, expected: type[GatewayError]) -> None:
    mapped = map_upstream_exception(exc, retry_after_s=2)
    assert type(mapped) is expected


def test_connection_refused_maps_to_503_with_retry_after() -> None:
    exc = asyncio.run(_refused())
    assert isinstance(exc, aiohttp.ClientConnectorError)
    mapped = map_upstream_exception(exc, retry_after_s=2)
    assert isinstance(mapped, UpstreamUnavailableError)
    assert mapped.headers() == [(b"retry-after", b"2")]
    assert "127.0.0.1" not in mapped.message


def test_gateway_errors_map_to_themselves() -> None:
    error = BodyTooLargeError("m")
    assert map_upstream_exception(error, retry_after_s=1) is error
