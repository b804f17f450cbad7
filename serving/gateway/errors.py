"""Gateway errors as values with an HTTP status and an OpenAI-shaped body.

Every failure the gateway reports is one of these (DESIGN.md section 5):

    GatewayError                      (base: status, type, code, param, headers)
    ├── AuthenticationError           401 invalid_request_error / invalid_api_key
    ├── RouteNotFoundError            404 invalid_request_error / unknown_url
    ├── BodyTooLargeError             413 invalid_request_error / request_too_large
    ├── UpstreamRejectedError         the upstream's 4xx, re-shaped (invalid_request_error)
    └── UpstreamError                 502 server_error / upstream_error (error or reset)
        ├── UpstreamUnavailableError  503 server_error / upstream_unavailable + Retry-After
        └── UpstreamTimeoutError      504 timeout / upstream_timeout (idle too long)

Failures of the hop client (aiohttp, sockets, timeouts) are translated into this tree in
exactly one place, `map_upstream_exception`. Messages never contain a key or an internal
address: they are shown to API clients.
"""

from __future__ import annotations

import json
from typing import ClassVar

import aiohttp


class GatewayError(Exception):
    """A failure reported to the client as `{"error": {message, type, param, code}}`."""

    status: ClassVar[int] = 500
    type: ClassVar[str] = "server_error"
    code: ClassVar[str | None] = None

    def __init__(
        self, message: str, *, param: str | None = None, retry_after_s: int | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.retry_after_s = retry_after_s

    @property
    def http_status(self) -> int:
        return self.status

    def payload(self) -> dict[str, object]:
        """The inner `error` object."""
        return {"message": self.message, "type": self.type, "param": self.param, "code": self.code}

    def body(self) -> bytes:
        """The JSON response body."""
        return json.dumps({"error": self.payload()}, separators=(",", ":")).encode()

    def sse_event(self) -> bytes:
        """The same error as a final server-sent event (after a stream has started)."""
        return b"data: " + self.body() + b"\n\n"

    def headers(self) -> list[tuple[bytes, bytes]]:
        """Extra response headers this error carries (e.g. `Retry-After`)."""
        if self.retry_after_s is None:
            return []
        return [(b"retry-after", str(self.retry_after_s).encode())]


class AuthenticationError(GatewayError):
    status = 401
    type = "invalid_request_error"
    code = "invalid_api_key"

    def __init__(self) -> None:
        # One constant message: missing, malformed, wrong-scheme and unknown keys all look
        # the same, and the key is never echoed.
        super().__init__("Invalid API key. Send a valid key as 'Authorization: Bearer <key>'.")

    def headers(self) -> list[tuple[bytes, bytes]]:
        return [(b"www-authenticate", b"Bearer")]


class RouteNotFoundError(GatewayError):
    status = 404
    type = "invalid_request_error"
    code = "unknown_url"


class BodyTooLargeError(GatewayError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class UpstreamRejectedError(GatewayError):
    """An upstream 4xx whose body was not OpenAI-shaped; keeps the upstream's status."""

    type = "invalid_request_error"

    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message)
        self._status = status

    @property
    def http_status(self) -> int:
        return self._status


class UpstreamError(GatewayError):
    status = 502
    type = "server_error"
    code = "upstream_error"


class UpstreamUnavailableError(UpstreamError):
    status = 503
    code = "upstream_unavailable"


class UpstreamTimeoutError(UpstreamError):
    status = 504
    type = "timeout"
    code = "upstream_timeout"


# What the hop client raises for a failed exchange (aiohttp.ServerTimeoutError and
# ConnectionTimeoutError are TimeoutErrors; ClientOSError is an OSError).
UPSTREAM_FAILURES: tuple[type[Exception], ...] = (aiohttp.ClientError, OSError, TimeoutError)


def map_upstream_exception(exc: Exception, *, retry_after_s: int) -> GatewayError:
    """The one translation of hop-client failures into gateway errors, most specific first.

    Callers catch `UPSTREAM_FAILURES` and pass the exception here. Whether a response had
    started decides only how the error is delivered (a JSON response, or a final SSE event),
    not which error it is.
    """
    if isinstance(exc, GatewayError):
        return exc
    if isinstance(exc, aiohttp.ConnectionTimeoutError | aiohttp.ClientConnectorError):
        return UpstreamUnavailableError(
            "The model server cannot be reached; retry later.", retry_after_s=retry_after_s
        )
    if isinstance(exc, TimeoutError):
        return UpstreamTimeoutError("The model server sent nothing for too long.")
    if isinstance(exc, aiohttp.ClientPayloadError):
        return UpstreamError("The model server's response was cut off.")
    if isinstance(exc, aiohttp.ServerDisconnectedError | ConnectionError):
        return UpstreamError("The model server closed the connection.")
    return UpstreamError(f"The model server failed ({type(exc).__name__}).")
