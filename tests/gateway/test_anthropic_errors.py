"""The gateway's errors in Anthropic's words: shape, status and type mapping, the SSE event,
rate-limit headers, and engine errors re-worded."""

from __future__ import annotations

import json

import pytest

from serving.gateway.anthropic_errors import ANTHROPIC, anthropic_status, anthropic_type
from serving.gateway.api_dialect import OPENAI
from serving.gateway.errors import (
    AuthenticationError,
    BodyTooLargeError,
    EndpointNotAllowedError,
    EngineBusyError,
    GatewayError,
    InternalError,
    InvalidRequestError,
    ModelNotFoundError,
    QuotaUnavailableError,
    RequestTimeoutError,
    RouteNotFoundError,
    UpstreamError,
    UpstreamRejectedError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
    refusal_error,
)
from serving.gateway.quota import RateLimitStatus, Refusal, RefusalReason, Scope
from serving.gateway.quota.decision import WindowStatus

STATUS = RateLimitStatus(requests=WindowStatus(10, 0, 12.5), tokens=WindowStatus(500, 20, 3.0))


def body(error: GatewayError) -> dict[str, object]:
    data = json.loads(ANTHROPIC.body(error))
    assert set(data) == {"type", "error"} and data["type"] == "error"
    assert set(data["error"]) == {"type", "message"}
    return dict(data["error"])


@pytest.mark.parametrize(
    ("error", "status", "kind"),
    [
        (InvalidRequestError("bad", param="x"), 400, "invalid_request_error"),
        (AuthenticationError(), 401, "authentication_error"),
        (EndpointNotAllowedError("no"), 403, "permission_error"),
        (ModelNotFoundError("m"), 404, "not_found_error"),
        (RouteNotFoundError("no"), 404, "not_found_error"),
        (RequestTimeoutError("slow"), 408, "timeout_error"),
        (BodyTooLargeError("big"), 413, "request_too_large"),
        (InternalError("bug"), 500, "api_error"),
        (UpstreamError("reset"), 502, "api_error"),
        (UpstreamUnavailableError("none", retry_after_s=1), 529, "overloaded_error"),
        (EngineBusyError("busy", retry_after_s=1), 529, "overloaded_error"),
        (QuotaUnavailableError("redis", retry_after_s=1), 529, "overloaded_error"),
        (UpstreamTimeoutError("idle"), 504, "timeout_error"),
        (UpstreamRejectedError("gone", status=410), 410, "invalid_request_error"),
    ],
)
def test_each_error_gets_anthropics_status_and_type(
    error: GatewayError, status: int, kind: str
) -> None:
    assert ANTHROPIC.status(error) == status
    assert body(error)["type"] == kind
    assert OPENAI.status(error) == error.http_status  # the OpenAI routes keep theirs


def test_retry_after_is_kept_on_an_overload() -> None:
    headers = dict(ANTHROPIC.error_headers(EngineBusyError("busy", retry_after_s=2)))
    assert headers[b"retry-after"] == b"2"


def test_the_message_names_the_field_and_the_auth_message_the_header() -> None:
    assert body(InvalidRequestError("must be an integer", param="max_tokens"))["message"] == (
        "max_tokens: must be an integer"
    )
    assert body(InvalidRequestError("'tools' must be an array.", param="tools"))["message"] == (
        "'tools' must be an array."
    )
    assert "x-api-key" in str(body(AuthenticationError())["message"])


def test_a_started_stream_ends_with_anthropics_error_event() -> None:
    event = ANTHROPIC.sse_event(UpstreamError("The model server closed the connection."))
    head, data = event.split(b"\n", 1)
    assert head == b"event: error" and data.startswith(b"data: ") and data.endswith(b"\n\n")
    assert json.loads(data[6:])["error"]["type"] == "api_error"


def test_a_refusal_carries_both_rate_limit_header_families() -> None:
    refusal = Refusal(RefusalReason.RPM, Scope("k"), 10, 10, 1, 12.5, STATUS)
    names = [name for name, _ in ANTHROPIC.error_headers(refusal_error(refusal))]
    assert b"retry-after" in names and b"x-ratelimit-limit-requests" in names
    assert b"anthropic-ratelimit-requests-limit" in names
    assert b"anthropic-ratelimit-tokens-remaining" in names
    assert body(refusal_error(refusal))["type"] == "rate_limit_error"
    openai_names = [name for name, _ in OPENAI.error_headers(refusal_error(refusal))]
    assert not [name for name in openai_names if name.startswith(b"anthropic-")]


def test_rate_limit_headers_on_success_are_both_families() -> None:
    names = {name for name, _ in ANTHROPIC.rate_limit_headers(STATUS)}
    assert {b"x-ratelimit-remaining-tokens", b"anthropic-ratelimit-tokens-remaining"} <= names


@pytest.mark.parametrize(
    "upstream",
    [
        {"type": "error", "error": {"type": "BadRequestError", "message": "too long"}},
        {"error": {"message": "too long", "type": "BadRequestError", "param": None, "code": 400}},
        {"object": "error", "message": "too long", "type": "BadRequestError", "code": 400},
    ],
)
def test_an_engines_error_is_reworded_in_anthropics_shape(upstream: dict[str, object]) -> None:
    passed = ANTHROPIC.upstream_error(400, json.dumps(upstream).encode())
    assert passed is not None
    status, reworded = passed
    assert status == 400
    assert json.loads(reworded) == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "too long"},
    }


def test_an_engine_overload_becomes_529_and_a_body_without_a_message_is_not_passed() -> None:
    passed = ANTHROPIC.upstream_error(503, b'{"error": {"message": "busy"}}')
    assert passed is not None and passed[0] == 529
    assert ANTHROPIC.upstream_error(404, b'{"detail": "Not Found"}') is None
    assert ANTHROPIC.upstream_error(500, b"<html>") is None
    assert ANTHROPIC.upstream_error(400, b'{"error": {"message": 3}}') is None


@pytest.mark.parametrize(
    ("status", "expected"), [(503, 529), (529, 529), (500, 500), (429, 429), (400, 400)]
)
def test_only_503_changes_status(status: int, expected: int) -> None:
    assert anthropic_status(status) == expected


def test_unlisted_statuses_follow_their_class() -> None:
    assert anthropic_type(409) == "invalid_request_error"
    assert anthropic_type(502) == "api_error"
