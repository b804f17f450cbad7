"""The OpenAI dialect, every route's but Anthropic's (those: test_anthropic_errors.py)."""

from __future__ import annotations

import json

from serving.gateway.api_dialect import OPENAI
from serving.gateway.errors import EngineBusyError, UpstreamError
from serving.gateway.quota import RateLimitStatus
from serving.gateway.quota.decision import WindowStatus


def test_errors_keep_their_status_and_openai_shape() -> None:
    error = EngineBusyError("busy", retry_after_s=1)
    assert OPENAI.status(error) == 503
    assert json.loads(OPENAI.body(error))["error"]["code"] == "engine_overloaded"
    assert OPENAI.sse_event(UpstreamError("cut")).startswith(b'data: {"error"')
    assert dict(OPENAI.error_headers(error))[b"retry-after"] == b"1"


def test_only_openai_shaped_engine_errors_pass() -> None:
    body = b'{"error": {"message": "no", "type": "BadRequestError"}}'
    assert OPENAI.upstream_error(400, body) == (400, body)
    assert OPENAI.upstream_error(404, b'{"detail": "Not Found"}') is None


def test_rate_limit_headers_are_the_x_ratelimit_family() -> None:
    status = RateLimitStatus(requests=WindowStatus(5, 4, 1.0))
    names = [name for name, _ in OPENAI.rate_limit_headers(status)]
    assert names == [
        b"x-ratelimit-limit-requests",
        b"x-ratelimit-remaining-requests",
        b"x-ratelimit-reset-requests",
    ]
