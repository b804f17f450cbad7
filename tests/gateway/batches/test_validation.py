"""Input files checked line by line: OpenAI's error entries, line numbers included."""

from __future__ import annotations

import io

import pytest

from serving.gateway.batches.validation import validate
from serving.gateway.errors import InvalidRequestError, UpstreamUnavailableError
from serving.gateway.request_fields import Kind

from .helpers import CHAT, jsonl, line


def refuse_long(kind: Kind, body: bytes) -> None:
    if b"too long" in body:
        raise InvalidRequestError("max_tokens is too large", param="max_tokens")


def codes(data: bytes, max_lines: int = 10) -> list[tuple[str, int | None, str | None]]:
    _, errors = validate(io.BytesIO(data), endpoint=CHAT, check=refuse_long, max_lines=max_lines)
    return [(e["code"], e["line"], e["param"]) for e in errors]


def test_good_lines_are_read_in_order() -> None:
    lines, errors = validate(
        io.BytesIO(jsonl(line("a"), b"", line("b"))), endpoint=CHAT, check=refuse_long, max_lines=10
    )
    assert errors == [] and [(x.line, x.custom_id) for x in lines] == [(1, "a"), (3, "b")]


def test_each_bad_line_is_named() -> None:
    data = jsonl(
        b"{not json",
        b"[1]",
        line("a"),
        line("a"),
        line("b", url="/v1/completions"),
        b'{"custom_id": "c", "method": "GET", "url": "/v1/chat/completions", "body": {}}',
        b'{"method": "POST"}',
        line("d", "too long"),
    )
    assert codes(data) == [
        ("invalid_json_line", 1, None),
        ("invalid_json_line", 2, None),
        ("duplicate_custom_id", 4, "custom_id"),
        ("invalid_url", 5, "url"),
        ("invalid_method", 6, "method"),
        ("missing_required_parameter", 7, "custom_id"),
        ("invalid_request", 8, "body.max_tokens"),
    ]


def test_too_many_lines_and_an_empty_file_fail() -> None:
    assert codes(jsonl(line("a"), line("b"), line("c")), max_lines=2) == [
        ("too_many_requests", 3, None)
    ]
    assert codes(b"\n\n") == [("empty_file", None, None)]


def test_an_engine_not_ready_is_not_the_files_fault() -> None:
    def not_ready(kind: Kind, body: bytes) -> None:
        raise UpstreamUnavailableError("later", retry_after_s=1)

    with pytest.raises(UpstreamUnavailableError):
        validate(io.BytesIO(jsonl(line("a"))), endpoint=CHAT, check=not_ready, max_lines=10)
