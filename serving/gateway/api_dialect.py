"""How the API a route speaks words what the gateway answers itself: its error bodies (JSON
before a response started, an SSE event after), their status and headers, and the
rate-limit headers (docs/gateway.md, errors and headers).

    dialect = dialect_of(path)          # route_table: OPENAI, or ANTHROPIC on /v1/messages*
    await send_bytes(send, dialect.status(error), dialect.body(error), ...)

`OPENAI` is every route's but Anthropic's Messages (`anthropic_errors.AnthropicDialect`).
"""

from __future__ import annotations

from typing import Protocol

from serving.gateway.errors import GatewayError, openai_error_body
from serving.gateway.quota import RateLimitStatus, rate_limit_raw_headers
from serving.gateway.types import RawHeaders


class Dialect(Protocol):
    def status(self, error: GatewayError) -> int:
        """The HTTP status `error` is sent with."""
        ...

    def body(self, error: GatewayError) -> bytes:
        """`error` as a JSON body."""
        ...

    def sse_event(self, error: GatewayError) -> bytes:
        """`error` as the final event of a stream that has started."""
        ...

    def error_headers(self, error: GatewayError) -> RawHeaders:
        """The headers `error` carries (`Retry-After`, a refusal's rate-limit state)."""
        ...

    def rate_limit_headers(self, status: RateLimitStatus) -> RawHeaders:
        """A key's rate-limit state, on every answer to it."""
        ...

    def upstream_error(self, status: int, body: bytes) -> tuple[int, bytes] | None:
        """The status and body an engine's error response is passed on with; None when its
        body is no error this API's clients could read (the gateway then words its own)."""
        ...


class OpenAIDialect:
    def status(self, error: GatewayError) -> int:
        return error.http_status

    def body(self, error: GatewayError) -> bytes:
        return error.body()

    def sse_event(self, error: GatewayError) -> bytes:
        return error.sse_event()

    def error_headers(self, error: GatewayError) -> RawHeaders:
        return error.headers()

    def rate_limit_headers(self, status: RateLimitStatus) -> RawHeaders:
        return rate_limit_raw_headers(status)

    def upstream_error(self, status: int, body: bytes) -> tuple[int, bytes] | None:
        passed = openai_error_body(body)
        return None if passed is None else (status, passed)


OPENAI: Dialect = OpenAIDialect()
