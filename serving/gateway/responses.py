"""Complete responses the gateway writes itself (JSON bodies, and errors in the words of the
route's API)."""

from __future__ import annotations

import json

from serving.gateway.api_dialect import OPENAI, Dialect
from serving.gateway.errors import GatewayError
from serving.gateway.forwarded_headers import REQUEST_ID
from serving.gateway.types import RawHeaders, Send


async def send_bytes(
    send: Send,
    status: int,
    body: bytes,
    *,
    request_id: bytes,
    content_type: bytes = b"application/json",
    headers: RawHeaders | None = None,
) -> None:
    """Send a whole response with a known length, in one body message."""
    response_headers: RawHeaders = [
        (b"content-type", content_type),
        (b"content-length", str(len(body)).encode()),
        (REQUEST_ID, request_id),
    ]
    if headers:
        response_headers.extend(headers)
    await send({"type": "http.response.start", "status": status, "headers": response_headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_json(
    send: Send,
    status: int,
    payload: object,
    *,
    request_id: bytes,
    headers: RawHeaders | None = None,
) -> None:
    body = json.dumps(payload, separators=(",", ":")).encode()
    await send_bytes(send, status, body, request_id=request_id, headers=headers)


async def send_error(
    send: Send,
    error: GatewayError,
    *,
    request_id: bytes,
    headers: RawHeaders | None = None,
    dialect: Dialect = OPENAI,
) -> None:
    """An error response in `dialect`'s shape, with its status and headers (plus `headers`,
    e.g. the rate-limit state)."""
    extra = dialect.error_headers(error)
    if headers:
        extra.extend(headers)
    body = dialect.body(error)
    await send_bytes(send, dialect.status(error), body, request_id=request_id, headers=extra)
