"""Header filtering in both directions and the request id."""

from __future__ import annotations

import pytest

from serving.gateway.forwarded_headers import (
    HOP_BY_HOP,
    client_response_headers,
    request_id,
    upstream_request_headers,
)


@pytest.mark.parametrize("value", [b"abc", b"A-b_c.d:e", b"x" * 128])
def test_sane_request_ids_are_kept(value: bytes) -> None:
    assert request_id(value) == value


@pytest.mark.parametrize("value", [None, b"", b"x" * 129, b"a b", b"a\nb", b"caf\xc3\xa9", b"a;b"])
def test_other_request_ids_are_replaced(value: bytes | None) -> None:
    generated = request_id(value)
    assert generated != value
    assert len(generated) == 32
    assert int(generated, 16) >= 0
    assert request_id(value) != generated


def test_upstream_request_headers() -> None:
    headers = [
        (b"host", b"gateway"),
        (b"authorization", b"Bearer sk-secret"),
        (b"content-type", b"application/json"),
        (b"content-length", b"2"),
        (b"connection", b"keep-alive, X-Named"),
        (b"x-named", b"1"),
        (b"x-request-id", b"client"),
        (b"expect", b"100-continue"),
        (b"accept", b"text/event-stream"),
        *[(name, b"v") for name in HOP_BY_HOP if name != b"connection"],
    ]
    assert upstream_request_headers(headers, b"rid") == (
        b"content-type: application/json\r\naccept: text/event-stream\r\nx-request-id: rid\r\n"
    )


def test_client_response_headers() -> None:
    raw = [
        (b"Content-Type", b"text/event-stream"),
        (b"Transfer-Encoding", b"chunked"),
        (b"Content-Length", b"10"),
        (b"Connection", b"X-Named"),
        (b"X-Named", b"1"),
        (b"Server", b"uvicorn"),
        (b"Date", b"today"),
        (b"X-Request-Id", b"upstream"),
        (b"Cache-Control", b"no-cache"),
    ]
    assert client_response_headers(raw, b"rid") == [
        (b"content-type", b"text/event-stream"),
        (b"cache-control", b"no-cache"),
        (b"x-request-id", b"rid"),
    ]
