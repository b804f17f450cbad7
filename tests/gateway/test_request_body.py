"""Reading a request's body (`request_body`)."""

from __future__ import annotations

import asyncio

import pytest

from serving.gateway.errors import BodyTooLargeError, ClientGone
from serving.gateway.request_body import is_plain_path, read_body, worth_precheck
from tests.gateway.test_app import receiver


def test_read_body_joins_chunks() -> None:
    _, receive = receiver(
        {"type": "http.request", "body": b"ab", "more_body": True},
        {"type": "http.request", "body": b"", "more_body": True},
        {"type": "http.request", "body": b"cd", "more_body": False},
    )
    assert asyncio.run(read_body(receive, 4, None)) == b"abcd"


def test_read_body_limits() -> None:
    _, receive = receiver({"type": "http.request", "body": b"abcde", "more_body": False})
    with pytest.raises(BodyTooLargeError):
        asyncio.run(read_body(receive, 4, None))
    with pytest.raises(BodyTooLargeError):
        asyncio.run(read_body(receive, 4, b"5"))


def test_read_body_reports_disconnect() -> None:
    _, receive = receiver(
        {"type": "http.request", "body": b"ab", "more_body": True}, {"type": "http.disconnect"}
    )
    with pytest.raises(ClientGone):
        asyncio.run(read_body(receive, 100, None))


def test_worth_precheck_for_large_or_unknown_lengths() -> None:
    assert worth_precheck(None)
    assert worth_precheck(b"chunked")
    assert worth_precheck(b"%d" % (64 * 1024 + 1))
    assert not worth_precheck(b"%d" % (64 * 1024))


def test_plain_paths() -> None:
    assert is_plain_path("/v1/chat/completions")
    assert is_plain_path("/v1/files/a.b")
    assert not is_plain_path("/v1/../admin")
    assert not is_plain_path("/v1/./models")
