"""Forward one request to the upstream and relay the response back as it arrives.

    outcome = await Proxy(client, retry_after_s=1).forward(request, receive, send)

The exchange with the upstream races the client's `http.disconnect`: whichever ends first
wins, and a client that goes away cancels the exchange, which closes the upstream connection
so vLLM aborts the request and frees its KV cache. Bodies are relayed chunk by chunk with one
`await send` per chunk, so a slow client slows the upstream read (backpressure).

How the response is relayed:
- upstream 2xx/3xx with a small known length: read whole, sent with its length;
- other 2xx/3xx (SSE, chunked): streamed; a failure mid-stream ends an SSE response with a
  final `data: {"error": ...}` event (never a fake `[DONE]`) and cuts any other response,
  so the client sees it truncated;
- upstream 4xx/5xx: an OpenAI-shaped error body passes through with its status; anything
  else is wrapped (5xx becomes 502, a 4xx keeps its status);
- no response at all: the mapped error (503 unreachable, 502 reset, 504 idle timeout).
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass

import aiohttp

from serving.gateway.asgi import RawHeaders, Receive, Send
from serving.gateway.errors import (
    UPSTREAM_FAILURES,
    GatewayError,
    UpstreamError,
    UpstreamRejectedError,
    map_upstream_exception,
)
from serving.gateway.headers import client_response_headers, upstream_request_headers
from serving.gateway.responses import send_bytes, send_error
from serving.gateway.upstream import UpstreamClient

logger = logging.getLogger(__name__)

# Upstream 2xx bodies up to this size with a declared length are relayed in one piece.
WHOLE_BODY_LIMIT = 1024 * 1024
# Upstream error bodies are read up to this size to see whether they are OpenAI-shaped.
ERROR_BODY_LIMIT = 64 * 1024


@dataclass(frozen=True, slots=True)
class ProxyRequest:
    """A client request, its body already read, as the proxy forwards it."""

    method: str
    target: bytes
    """Raw path and query, still percent-encoded: ``/v1/models?x=1``."""
    headers: RawHeaders
    body: bytes
    request_id: bytes


@dataclass(slots=True)
class ProxyOutcome:
    """What happened, filled in as it happens (for logs and, later, metrics and settling)."""

    status: int = 0
    """Status sent to the client; 0 when nothing was sent."""
    upstream_status: int | None = None
    error: GatewayError | None = None
    client_disconnected: bool = False


class Proxy:
    def __init__(self, client: UpstreamClient, *, retry_after_s: int) -> None:
        self._client = client
        self._retry_after_s = retry_after_s

    async def forward(self, request: ProxyRequest, receive: Receive, send: Send) -> ProxyOutcome:
        """Relay `request` to the upstream and its response to `send`, unless the client
        disconnects first."""
        outcome = ProxyOutcome()
        exchange = asyncio.ensure_future(self._exchange(request, send, outcome))
        watcher = asyncio.ensure_future(wait_for_disconnect(receive))
        try:
            await asyncio.wait((exchange, watcher), return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            exchange.cancel()
            watcher.cancel()
            raise
        if exchange.done():
            watcher.cancel()
            exchange.result()  # re-raise what is not an upstream failure: a bug
            return outcome
        outcome.client_disconnected = True
        exchange.cancel()
        try:
            await exchange  # returns once the upstream response is closed
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise
        logger.info("request %s: client disconnected", request.request_id.decode())
        return outcome

    async def _exchange(self, request: ProxyRequest, send: Send, outcome: ProxyOutcome) -> None:
        try:
            response = await self._client.session.request(
                request.method,
                self._client.url(request.target),
                headers=upstream_request_headers(request.headers, request.request_id),
                data=request.body or None,
                allow_redirects=False,
            )
        except UPSTREAM_FAILURES as exc:
            await self._fail(exc, request, send, outcome)
            return
        outcome.upstream_status = response.status
        try:
            if response.status >= 400:
                await self._relay_error(response, request, send, outcome)
            elif response.content_length is not None and (
                response.content_length <= WHOLE_BODY_LIMIT
            ):
                await self._relay_whole(response, request, send, outcome)
            else:
                await self._relay_stream(response, request, send, outcome)
        finally:
            # Released (back to the pool) when the body was read to its end; otherwise,
            # e.g. when cancelled, the connection is closed and the upstream sees it.
            response.close()

    async def _relay_whole(
        self,
        response: aiohttp.ClientResponse,
        request: ProxyRequest,
        send: Send,
        outcome: ProxyOutcome,
    ) -> None:
        try:
            body = await response.read()
        except UPSTREAM_FAILURES as exc:
            await self._fail(exc, request, send, outcome)
            return
        headers = client_response_headers(response.raw_headers, request.request_id)
        headers.append((b"content-length", str(len(body)).encode()))
        outcome.status = response.status
        await send({"type": "http.response.start", "status": response.status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    async def _relay_stream(
        self,
        response: aiohttp.ClientResponse,
        request: ProxyRequest,
        send: Send,
        outcome: ProxyOutcome,
    ) -> None:
        headers = client_response_headers(response.raw_headers, request.request_id)
        outcome.status = response.status
        await send({"type": "http.response.start", "status": response.status, "headers": headers})
        last = b"\n\n"
        try:
            async for chunk in response.content.iter_any():
                last = chunk
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except UPSTREAM_FAILURES as exc:
            error = self._record(exc, request, outcome)
            if response.content_type != "text/event-stream":
                return  # response left incomplete: the server cuts the connection
            # End a half-sent event first, so the error event parses on its own.
            separator = b"" if last.endswith((b"\n\n", b"\r\n\r\n")) else b"\n\n"
            body = separator + error.sse_event()
            await send({"type": "http.response.body", "body": body, "more_body": False})
            return
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _relay_error(
        self,
        response: aiohttp.ClientResponse,
        request: ProxyRequest,
        send: Send,
        outcome: ProxyOutcome,
    ) -> None:
        chunks: list[bytes] = []
        size = 0
        try:
            async for chunk in response.content.iter_any():
                chunks.append(chunk)
                size += len(chunk)
                if size > ERROR_BODY_LIMIT:
                    break
        except UPSTREAM_FAILURES as exc:
            await self._fail(exc, request, send, outcome)
            return
        body = openai_error_body(b"".join(chunks))
        if body is not None:
            outcome.status = response.status
            await send_bytes(send, response.status, body, request_id=request.request_id)
            return
        error = wrap_upstream_status(response.status, b"".join(chunks))
        logger.warning(
            "request %s: upstream answered %d without an OpenAI error body",
            request.request_id.decode(),
            response.status,
        )
        outcome.error = error
        outcome.status = error.http_status
        await send_error(send, error, request_id=request.request_id)

    def _record(self, exc: Exception, request: ProxyRequest, outcome: ProxyOutcome) -> GatewayError:
        error = map_upstream_exception(exc, retry_after_s=self._retry_after_s)
        logger.warning(
            "request %s: upstream failed: %s (%s: %s)",
            request.request_id.decode(),
            error.code,
            type(exc).__name__,
            exc,
        )
        outcome.error = error
        return error

    async def _fail(
        self, exc: Exception, request: ProxyRequest, send: Send, outcome: ProxyOutcome
    ) -> None:
        error = self._record(exc, request, outcome)
        outcome.status = error.http_status
        await send_error(send, error, request_id=request.request_id)


async def wait_for_disconnect(receive: Receive) -> None:
    """Return when the ASGI server reports that the client went away."""
    while (await receive())["type"] != "http.disconnect":
        pass


def openai_error_body(body: bytes) -> bytes | None:
    """`body` if it is an OpenAI error (vLLM's flat legacy shape is re-nested), else None."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(data, dict):
        return None
    inner = data.get("error")
    if isinstance(inner, dict) and isinstance(inner.get("message"), str):
        return body
    if data.get("object") == "error" and isinstance(data.get("message"), str):
        nested = {key: data.get(key) for key in ("message", "type", "param", "code")}
        return json.dumps({"error": nested}, separators=(",", ":")).encode()
    return None


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
