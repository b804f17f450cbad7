"""The gateway's answers in the words of Anthropic's Messages API (docs/anthropic.md, errors).

    ANTHROPIC.body(InvalidRequestError("...", param="max_tokens"))
    # {"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: ..."}}

Rules:
- the status is the gateway's, except that 503 (no engine, engine slots all taken, the
  quota store away) is Anthropic's 529 `overloaded_error`: its clients retry it as a
  temporary overload, with `retry-after`; the `type` follows the status as Anthropic maps
  them, whatever the gateway's OpenAI `type` and `code` were;
- a stream that has started ends with Anthropic's `event: error`;
- rate-limit headers are Anthropic's (`anthropic-ratelimit-*`) beside the OpenAI ones;
- an engine's error (Anthropic-, OpenAI- or vLLM-shaped) is passed on re-worded the same way.
"""

from __future__ import annotations

import json

from serving.gateway.errors import (
    AuthenticationError,
    GatewayError,
    RateLimitError,
    upstream_error_object,
)
from serving.gateway.quota import RateLimitStatus, rate_limit_raw_headers
from serving.gateway.quota.anthropic_headers import anthropic_rate_limit_headers
from serving.gateway.types import RawHeaders

OVERLOADED_STATUS = 529
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    OVERLOADED_STATUS: "overloaded_error",
}
_AUTH_MESSAGE = (
    "Invalid API key. Send a valid key as 'x-api-key: <key>' or 'Authorization: Bearer <key>'."
)


def anthropic_status(status: int) -> int:
    return OVERLOADED_STATUS if status == 503 else status


def anthropic_type(status: int) -> str:
    """Anthropic's error `type` for an (Anthropic) status."""
    return _TYPES.get(status) or ("api_error" if status >= 500 else "invalid_request_error")


def error_body(status: int, message: str) -> bytes:
    payload = {"type": "error", "error": {"type": anthropic_type(status), "message": message}}
    return json.dumps(payload, separators=(",", ":")).encode()


class AnthropicDialect:
    def status(self, error: GatewayError) -> int:
        return anthropic_status(error.http_status)

    def body(self, error: GatewayError) -> bytes:
        if isinstance(error, AuthenticationError):
            message = _AUTH_MESSAGE
        elif error.param and error.param not in error.message:
            message = f"{error.param}: {error.message}"  # Anthropic names the field so
        else:
            message = error.message
        return error_body(self.status(error), message)

    def sse_event(self, error: GatewayError) -> bytes:
        return b"event: error\ndata: " + self.body(error) + b"\n\n"

    def error_headers(self, error: GatewayError) -> RawHeaders:
        headers = error.headers()
        if isinstance(error, RateLimitError):
            headers.extend(anthropic_rate_limit_headers(error.rate_limit))
        return headers

    def rate_limit_headers(self, status: RateLimitStatus) -> RawHeaders:
        return [*rate_limit_raw_headers(status), *anthropic_rate_limit_headers(status)]

    def upstream_error(self, status: int, body: bytes) -> tuple[int, bytes] | None:
        found = upstream_error_object(body)  # Anthropic's shape, OpenAI's or vLLM's flat one
        if found is None:
            return None
        status = anthropic_status(status)
        return status, error_body(status, found[0]["message"])


ANTHROPIC = AnthropicDialect()
