"""Responses the gateway writes itself: framing, request id, error bodies and headers."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

from serving.gateway.errors import RouteNotFoundError, UpstreamUnavailableError
from serving.gateway.responses import send_bytes, send_error, send_json
from serving.gateway.types import Message, Send


def collect(respond: Callable[[Send], Awaitable[None]]) -> list[Message]:
    """The ASGI messages `respond(send)` sends."""
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    asyncio.run(respond(send))  # type: ignore[arg-type]
    return sent


def test_send_bytes_frames_one_body_with_its_length_and_request_id() -> None:
    start, body = collect(
        lambda send: send_bytes(send, 201, b"abc", request_id=b"rid-1", headers=[(b"x-a", b"1")])
    )
    assert start["status"] == 201
    assert start["headers"] == [
        (b"content-type", b"application/json"),
        (b"content-length", b"3"),
        (b"x-request-id", b"rid-1"),
        (b"x-a", b"1"),
    ]
    assert body == {"type": "http.response.body", "body": b"abc", "more_body": False}


def test_send_json_is_compact() -> None:
    _, body = collect(lambda send: send_json(send, 200, {"a": [1, 2]}, request_id=b"r"))
    assert body["body"] == b'{"a":[1,2]}'


def test_send_error_carries_the_errors_headers_and_the_extra_ones() -> None:
    error = UpstreamUnavailableError("down", retry_after_s=2)
    start, body = collect(
        lambda send: send_error(send, error, request_id=b"r", headers=[(b"x-ratelimit-x", b"1")])
    )
    assert start["status"] == 503
    names = [name for name, _ in start["headers"]]
    assert names[-3:] == [b"retry-after", b"retry-after-ms", b"x-ratelimit-x"]
    assert json.loads(body["body"])["error"]["code"] == "upstream_unavailable"


def test_send_error_without_extra_headers() -> None:
    start, _ = collect(lambda send: send_error(send, RouteNotFoundError("no"), request_id=b"r"))
    assert start["status"] == 404
