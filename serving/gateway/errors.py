"""Gateway errors as values with an HTTP status and an OpenAI-shaped body (docs/architecture.md,
errors and metrics; the table of statuses: docs/gateway.md, errors and headers).

Rules:
- every failure the gateway reports is a `GatewayError` subclass, and every mapping into
  them lives here: hop and socket failures (`map_upstream_exception`), upstream error
  responses (`openai_error_body` passed through, `wrap_upstream_status` re-shaped), quota
  refusals (`refusal_error`, `quota_unavailable_error`) and the metrics' `kind` label
  (`upstream_error_kind`);
- `Retry-After` is built by `retry_after_headers` alone;
- messages never contain a key or an internal address: API clients see them.
"""

from __future__ import annotations

import json
import math
from typing import Any, ClassVar

import aiohttp

from serving.gateway.failures import GatewayException
from serving.gateway.hop_connection import (
    HopConnectError,
    HopError,
    HopPayloadError,
    HopProtocolError,
)
from serving.gateway.quota import RateLimitStatus, Refusal, rate_limit_raw_headers
from serving.gateway.types import RawHeaders


def retry_after_headers(seconds: float) -> RawHeaders:
    """`Retry-After` in whole seconds, rounded up (at least 1 when any wait is asked for),
    and `retry-after-ms`, which the official clients read first (finer than seconds)."""
    if seconds <= 0:
        return [(b"retry-after", b"0"), (b"retry-after-ms", b"0")]
    whole = max(1, math.ceil(seconds))
    millis = max(1, math.ceil(seconds * 1000))
    return [(b"retry-after", b"%d" % whole), (b"retry-after-ms", b"%d" % millis)]


class ClientGone(GatewayException):
    """The client went away before it was answered (while sending its body, or while its
    request waited for a slot): there is nobody to answer, and the request never ran."""


class GatewayError(GatewayException):
    """A failure reported to the client as `{"error": {message, type, param, code}}`."""

    status: ClassVar[int] = 500
    type: ClassVar[str] = "server_error"
    code: ClassVar[str | None] = None

    def __init__(
        self, message: str, *, param: str | None = None, retry_after_s: float | None = None
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

    def headers(self) -> RawHeaders:
        """Extra response headers this error carries (e.g. `Retry-After`)."""
        if self.retry_after_s is None:
            return []
        return retry_after_headers(self.retry_after_s)


class AuthenticationError(GatewayError):
    status = 401
    type = "invalid_request_error"
    code = "invalid_api_key"

    def __init__(self) -> None:
        # One constant message: missing, malformed, wrong-scheme and unknown keys all look
        # the same, and the key is never echoed.
        super().__init__("Invalid API key. Send a valid key as 'Authorization: Bearer <key>'.")

    def headers(self) -> RawHeaders:
        return [(b"www-authenticate", b"Bearer")]


class InvalidRequestError(GatewayError):
    """A malformed body or a bad field; `param` names the field (None for the whole body)."""

    status = 400
    type = "invalid_request_error"


class EndpointNotAllowedError(GatewayError):
    status = 403
    type = "invalid_request_error"
    code = "endpoint_not_allowed"


class ModelNotFoundError(GatewayError):
    """The key may not use the model: worded as OpenAI does, so it reveals nothing more."""

    status = 404
    type = "invalid_request_error"
    code = "model_not_found"

    def __init__(self, model: str) -> None:
        super().__init__(
            f"The model `{model}` does not exist or you do not have access to it.", param="model"
        )


class RequestTimeoutError(GatewayError):
    status = 408
    type = "invalid_request_error"
    code = "request_timeout"


class RouteNotFoundError(GatewayError):
    status = 404
    type = "invalid_request_error"
    code = "unknown_url"


class BodyTooLargeError(GatewayError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class RateLimitError(GatewayError):
    """A quota refusal (a `quota.Refusal`): its type and code vary with the limit; it
    carries the rate-limit state the refusal was decided on."""

    status = 429

    def __init__(
        self,
        message: str,
        *,
        error_type: str,
        code: str,
        retry_after_s: float,
        rate_limit: RateLimitStatus,
    ) -> None:
        super().__init__(message, retry_after_s=retry_after_s)
        self.error_type = error_type
        self.error_code = code
        self.rate_limit = rate_limit
        """The state the refusal was decided on (each API names its headers its way)."""

    def payload(self) -> dict[str, object]:
        return {
            "message": self.message,
            "type": self.error_type,
            "param": None,
            "code": self.error_code,
        }

    def headers(self) -> RawHeaders:
        return [*super().headers(), *rate_limit_raw_headers(self.rate_limit)]


class QuotaUnavailableError(GatewayError):
    status = 503
    type = "server_error"
    code = "quota_store_unavailable"


class InternalError(GatewayError):
    """A failure of the gateway itself (a bug): the one answer of the app's error boundary."""

    status = 500
    type = "server_error"
    code = "internal_error"


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


class EngineBusyError(GatewayError):
    """A request waited its deadline in the gateway's fair queue: the engines' slots were all
    taken (by other keys' requests, or by this key's share). Nothing was charged."""

    status = 503
    code = "engine_overloaded"


class UpstreamTimeoutError(UpstreamError):
    status = 504
    type = "timeout"
    code = "upstream_timeout"


# What the hop clients raise for a failed exchange (HopTimeoutError, aiohttp.ServerTimeoutError
# and ConnectionTimeoutError are TimeoutErrors; ClientOSError is an OSError).
UPSTREAM_FAILURES: tuple[type[Exception], ...] = (
    HopError,
    aiohttp.ClientError,
    OSError,
    TimeoutError,
)


def map_upstream_exception(exc: Exception, *, retry_after_s: int) -> GatewayError:
    """The one translation of hop-client failures into gateway errors, most specific first.

    Callers catch `UPSTREAM_FAILURES` and pass the exception here. Whether a response had
    started decides only how the error is delivered (a JSON response, or a final SSE event),
    not which error it is.
    """
    if isinstance(exc, GatewayError):
        return exc
    if isinstance(
        exc, HopConnectError | aiohttp.ConnectionTimeoutError | aiohttp.ClientConnectorError
    ):
        return UpstreamUnavailableError(
            "The model server cannot be reached; retry later.", retry_after_s=retry_after_s
        )
    if isinstance(exc, TimeoutError):
        return UpstreamTimeoutError("The model server sent nothing for too long.")
    if isinstance(exc, HopPayloadError | aiohttp.ClientPayloadError):
        return UpstreamError("The model server's response was cut off.")
    if isinstance(exc, HopProtocolError):
        return UpstreamError("The model server's response was not valid HTTP.")
    if isinstance(exc, aiohttp.ServerDisconnectedError | ConnectionError):
        return UpstreamError("The model server closed the connection.")
    return UpstreamError(f"The model server failed ({type(exc).__name__}).")


def upstream_error_object(body: bytes) -> tuple[dict[str, Any], bool] | None:
    """An engine's error body's error object (with a string `message`), and whether it was
    nested under `error` (OpenAI's and Anthropic's shape) rather than vLLM's flat legacy one;
    None for any other body."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    inner = data.get("error")
    if isinstance(inner, dict) and isinstance(inner.get("message"), str):
        return inner, True
    if data.get("object") == "error" and isinstance(data.get("message"), str):
        return data, False
    return None


def openai_error_body(body: bytes) -> bytes | None:
    """`body` if it is an OpenAI error (vLLM's flat legacy shape is re-nested), else None."""
    found = upstream_error_object(body)
    if found is None:
        return None
    error, nested = found
    if nested:
        return body
    flat = {key: error.get(key) for key in ("message", "type", "param", "code")}
    return json.dumps({"error": flat}, separators=(",", ":")).encode()


def wrap_upstream_status(status: int, body: bytes) -> GatewayError:
    """The error reported for an upstream 4xx/5xx whose body is not an OpenAI error."""
    if status >= 500:
        return UpstreamError(f"The model server failed (HTTP {status}).")
    detail: object = None
    try:
        data = json.loads(body)
        if isinstance(data, dict):
            detail = data.get("detail")
    except (ValueError, UnicodeDecodeError):
        pass
    message = detail if isinstance(detail, str) else f"The model server refused (HTTP {status})."
    return UpstreamRejectedError(message, status=status)


def refusal_error(refusal: Refusal) -> RateLimitError:
    """The 429 for a quota refusal, with its `Retry-After` and rate-limit headers."""
    wait = refusal.retry_after
    if not math.isfinite(wait):
        wait = float(refusal.retry_after_header)
    return RateLimitError(
        refusal.message,
        error_type=refusal.error_type,
        code=refusal.code,
        retry_after_s=wait,
        rate_limit=refusal.rate_limit,
    )


def quota_unavailable_error(retry_after_s: float) -> QuotaUnavailableError:
    """The 503 for a request whose limits could not be checked (the shared store did not
    answer in time and the failure policy is `closed`): nothing was forwarded."""
    return QuotaUnavailableError(
        "Rate limits cannot be checked right now; retry later.", retry_after_s=retry_after_s
    )


def upstream_error_kind(
    error: GatewayError | None, upstream_status: int | None, response_problem: str | None
) -> str | None:
    """The `kind` label of gateway_upstream_errors_total for one exchange, if any.

    `response_problem` is what reading a 2xx body found (`in_band`, `bad_json`, ...)."""
    if isinstance(error, UpstreamTimeoutError):
        return "timeout"
    if isinstance(error, UpstreamUnavailableError):
        return "connect"
    if (upstream_status or 0) >= 500:
        return "status_5xx"
    if error is not None and not isinstance(error, UpstreamRejectedError):
        return "reset"
    return response_problem
