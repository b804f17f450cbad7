"""The error tree: statuses, OpenAI shapes, and the one mapping of hop-client failures."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from serving.gateway.errors import (
    UPSTREAM_FAILURES,
    AuthenticationError,
    BodyTooLargeError,
    GatewayError,
    RouteNotFoundError,
    UpstreamError,
    UpstreamRejectedError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
    map_upstream_exception,
    refusal_error,
    retry_after_headers,
    upstream_error_kind,
)
from serving.gateway.hop_connection import (
    HopConnectError,
    HopDisconnectedError,
    HopPayloadError,
    HopProtocolError,
    HopTimeoutError,
)
from serving.gateway.quota import (
    RateLimitStatus,
    Refusal,
    RefusalReason,
    Scope,
    WindowStatus,
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
    assert UpstreamUnavailableError("m", retry_after_s=7).headers() == [
        (b"retry-after", b"7"),
        (b"retry-after-ms", b"7000"),
    ]
    assert UpstreamError("m").headers() == []


@pytest.mark.parametrize(
    ("seconds", "whole", "millis"),
    [
        (0, b"0", b"0"),
        (0.0004, b"1", b"1"),
        (0.2, b"1", b"200"),
        (1, b"1", b"1000"),
        (2.5, b"3", b"2500"),
    ],
)
def test_retry_after_headers_round_up(seconds: float, whole: bytes, millis: bytes) -> None:
    assert retry_after_headers(seconds) == [(b"retry-after", whole), (b"retry-after-ms", millis)]


def test_refusal_error_carries_its_wait_and_rate_limit_state() -> None:
    status = RateLimitStatus(requests=WindowStatus(limit=10, remaining=0, reset_after=0.25))
    refusal = Refusal(
        RefusalReason.RPM, Scope("k1", None), 10, 10, 1, retry_after=0.25, rate_limit=status
    )
    error = refusal_error(refusal)
    assert error.http_status == 429
    payload = json.loads(error.body())["error"]
    assert (payload["type"], payload["code"]) == ("requests", "rate_limit_exceeded")
    headers = dict(error.headers())
    assert headers[b"retry-after"] == b"1" and headers[b"retry-after-ms"] == b"250"
    assert headers[b"x-ratelimit-remaining-requests"] == b"0"


def test_a_budget_refusal_is_insufficient_quota() -> None:
    refusal = Refusal(RefusalReason.DAILY, Scope("k1", None), 100, 100, 5, retry_after=3600)
    payload = json.loads(refusal_error(refusal).body())["error"]
    assert (payload["type"], payload["code"]) == ("insufficient_quota", "insufficient_quota")


@pytest.mark.parametrize(
    ("error", "status", "problem", "kind"),
    [
        (UpstreamTimeoutError("idle"), None, None, "timeout"),
        (UpstreamUnavailableError("down"), None, None, "connect"),
        (None, 503, None, "status_5xx"),
        (UpstreamError("reset"), 200, "in_band", "reset"),
        (UpstreamRejectedError("no", status=404), 404, None, None),
        (None, 200, "in_band", "in_band"),
        (None, 200, "bad_json", "bad_json"),
        (None, 200, None, None),
    ],
)
def test_upstream_error_kind(
    error: GatewayError | None, status: int | None, problem: str | None, kind: str | None
) -> None:
    assert upstream_error_kind(error, status, problem) == kind


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
        (HopConnectError("refused"), UpstreamUnavailableError),
        (HopTimeoutError("idle"), UpstreamTimeoutError),
        (HopDisconnectedError("closed", before_response=False), UpstreamError),
        (HopPayloadError("cut"), UpstreamError),
        (HopProtocolError("garbage"), UpstreamError),
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
    assert mapped.headers() == retry_after_headers(2)
    assert "127.0.0.1" not in mapped.message


def test_gateway_errors_map_to_themselves() -> None:
    error = BodyTooLargeError("m")
    assert map_upstream_exception(error, retry_after_s=1) is error


def test_every_hop_client_failure_is_caught_and_a_cut_body_says_so() -> None:
    for exc in (HopConnectError("x"), HopTimeoutError("x"), HopProtocolError("x")):
        assert isinstance(exc, UPSTREAM_FAILURES)
    assert "cut off" in map_upstream_exception(HopPayloadError("x"), retry_after_s=1).message
    refused = map_upstream_exception(HopConnectError("x"), retry_after_s=2)
    assert refused.headers() == retry_after_headers(2)
