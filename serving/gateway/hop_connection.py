"""One keep-alive HTTP/1.1 connection to the upstream: an asyncio Protocol parsed by httptools
(`hop_pool` opens, pools and retries these; docs/architecture.md, the request path).

    response = await connection.exchange(request_bytes, head=False)   # headers are in
    while chunk := await response.read(): ...                          # b"" at the end
    response.close()                     # reusable when read to its end, else closed

Rules:
- one exchange at a time; `read` returns everything that arrived since the last call, joined;
- more than `HIGH_WATER` unread body bytes pause the socket: a slow client slows the
  upstream, not our memory;
- upstream silence (before the headers or between chunks) longer than the idle timeout fails
  the response with `HopTimeoutError`; time paused for a slow reader does not count; one loop
  timer per connection, re-armed only when it fires, never per chunk;
- `close()` hands the connection back only after a response read to its end on a kept-alive
  connection; any other end closes the socket, so vLLM aborts the request;
- a body without a length ends when the upstream closes; any other early close is an error;
- every failure is a `HopError` subclass; `errors.map_upstream_exception` maps them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httptools

from serving.gateway.failures import GatewayException

# Unread body bytes above this pause the socket; reading resumes once the reader took them.
HIGH_WATER = 256 * 1024


class HopError(GatewayException):
    """A failed exchange with the upstream."""


class HopConnectError(HopError):
    """No connection could be opened (refused, unresolvable, timed out)."""

    def __init__(self, message: str, *, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out
        """No answer within the connect timeout: the upstream may be only busy."""


class HopTimeoutError(HopError, TimeoutError):
    """The upstream sent nothing for longer than the idle timeout."""


class HopDisconnectedError(HopError, ConnectionError):
    """The connection closed before the response headers arrived."""

    def __init__(self, message: str, *, before_response: bool) -> None:
        super().__init__(message)
        self.before_response = before_response
        """Not a byte of the response had arrived (a stale keep-alive connection can be
        retried on a new one)."""


class HopPayloadError(HopError):
    """The response body was cut off or malformed."""


class HopProtocolError(HopError):
    """The upstream's bytes are not an HTTP/1.1 response."""


class HopResponse:
    """A response whose headers are in; its body arrives through `read`."""

    __slots__ = (
        "_chunks",
        "_connection",
        "_error",
        "_waiter",
        "complete",
        "content_length",
        "content_type",
        "headers",
        "held_back",
        "keep_alive",
        "received",
        "status",
        "until_close",
    )

    def __init__(self, connection: HopConnection) -> None:
        self._connection = connection
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        """Response headers, names lower-cased, in the order received."""
        self.content_length: int | None = None
        self.content_type = b""
        """The media type, lower-cased, without parameters (`text/event-stream`)."""
        self.keep_alive = False
        self.until_close = False
        """The body has neither a length nor chunks: it ends when the connection closes."""
        self.complete = False
        self.received = False
        self.held_back = False
        """Reading from the upstream was paused at least once: the reader fell behind."""
        self._chunks: list[bytes] = []
        self._error: HopError | None = None
        self._waiter: asyncio.Future[None] | None = None

    async def read(self) -> bytes:
        """The body bytes that arrived since the last call, waiting for some if none did;
        b"" once the body is complete. Raises the failure once the bytes before it are read."""
        while True:
            chunks = self._chunks
            if chunks:
                self._chunks = []
                self._connection.taken()
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)
            if self._error is not None:
                raise self._error
            if self.complete:
                return b""
            await self._wait()

    async def read_all(self) -> bytes:
        """The rest of the body, whole."""
        parts: list[bytes] = []
        while chunk := await self.read():
            parts.append(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def close(self) -> None:
        """Hand the connection back if this response was read to its end, else close it."""
        connection = self._connection
        if connection.response is not self:
            return
        connection.response = None
        reusable = self.complete and self.keep_alive and self._error is None and not self._chunks
        connection.done(reusable=reusable)

    async def _wait(self) -> None:
        waiter = self._waiter = self._connection.loop.create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: HopError) -> None:
        if self._error is None and not self.complete:
            self._error = error
            self._wake()


class HopConnection(asyncio.Protocol):
    """The protocol of one upstream socket; see the module docstring for its rules."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        idle_timeout_s: float,
        on_done: Callable[[HopConnection, bool], None],
    ) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.response: HopResponse | None = None
        self.closed = False
        self.reused = False
        """It has completed an exchange before (so it may have gone stale while idle)."""
        self.idle_since = 0.0
        self.opened_at = 0.0
        self._on_done = on_done
        self._parser = httptools.HttpResponseParser(self)
        self._idle_timeout_s = idle_timeout_s
        self._timer: asyncio.TimerHandle | None = None
        self._last_activity = 0.0
        self._buffered = 0
        self._paused = False
        self._head_only = False
        self._chunked = False

    # -- the exchange -----------------------------------------------------------------------

    async def exchange(self, request: bytes, *, head: bool = False) -> HopResponse:
        """Send `request` (head and body) and wait for the response headers. `head`: the
        request is a HEAD, whose response has no body."""
        transport = self.transport
        if transport is None or self.closed:
            raise HopDisconnectedError("the connection is closed", before_response=True)
        response = self.response = HopResponse(self)
        self._head_only = head
        self._chunked = False
        self._last_activity = now = self.loop.time()
        if self._timer is None:
            self._timer = self.loop.call_at(now + self._idle_timeout_s, self._on_timer)
        transport.write(request)
        while not response.status:
            if response._error is not None:
                raise response._error
            await response._wait()
        return response

    def done(self, *, reusable: bool) -> None:
        """The response was closed: back to the pool if `reusable`, else closed."""
        if reusable and not self.closed:
            self.reused = True
        else:
            self.close()
        self._on_done(self, not self.closed)

    def abandon(self) -> None:
        """Close it after an exchange that never produced a response for the caller."""
        self.response = None
        self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.close()
        self._stop_timer()

    def taken(self) -> None:
        """The reader took the buffered body."""
        self._buffered = 0
        if self._paused:
            self._paused = False
            if self.transport is not None and not self.closed:
                self.transport.resume_reading()

    # -- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        response = self.response
        if response is None or response.complete:
            self.close()  # bytes nobody asked for: the connection cannot be trusted
            return
        self._last_activity = self.loop.time()
        response.received = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if response.status:
                response._fail(HopPayloadError(f"malformed response body ({exc})"))
            else:
                response._fail(HopProtocolError(f"malformed response ({exc})"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._stop_timer()
        response = self.response
        if response is None or response.complete:
            return
        if not response.status:
            response._fail(
                HopDisconnectedError(
                    "the upstream closed the connection", before_response=not response.received
                )
            )
        elif response.until_close and exc is None:
            response.complete = True
            response._wake()
        else:
            response._fail(HopPayloadError("the response was cut off"))

    def eof_received(self) -> bool | None:
        return None  # close the transport; connection_lost then ends or fails the response

    # -- httptools callbacks ----------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        response = self.response
        assert response is not None
        name = name.lower()
        response.headers.append((name, value))
        if name == b"content-length":
            response.content_length = int(value) if value.isdigit() else None
        elif name == b"content-type":
            response.content_type = value.partition(b";")[0].strip().lower()
        elif name == b"transfer-encoding":
            self._chunked = b"chunked" in value.lower()

    def on_headers_complete(self) -> None:
        response = self.response
        assert response is not None
        parser = self._parser
        status = parser.get_status_code()
        if status < 200:  # 1xx: an interim response, the real one follows
            response.headers = []
            response.content_length = None
            response.content_type = b""
            self._chunked = False
            return
        response.keep_alive = parser.should_keep_alive() and not self._head_only
        response.until_close = (
            response.content_length is None
            and not self._chunked
            and status not in (204, 304)
            and not self._head_only
        )
        response.status = status
        if self._head_only:
            response.complete = True
        response._wake()

    def on_body(self, body: bytes) -> None:
        response = self.response
        assert response is not None
        if response.complete:
            return
        response._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            response.held_back = True
            self.transport.pause_reading()
        response._wake()

    def on_message_complete(self) -> None:
        response = self.response
        if response is not None and response.status and not response.complete:
            response.complete = True
            response._wake()

    # -- idle timeout -----------------------------------------------------------------------

    def _on_timer(self) -> None:
        self._timer = None
        response = self.response
        if self.closed or response is None or response.complete or response._error is not None:
            return  # idle in the pool, or done: the next exchange arms it again
        now = self.loop.time()
        if self._paused:
            self._last_activity = now  # waiting for our reader, not for the upstream
        deadline = self._last_activity + self._idle_timeout_s
        if now >= deadline:
            response._fail(HopTimeoutError("the upstream sent nothing for too long"))
            self.close()
            return
        self._timer = self.loop.call_at(deadline, self._on_timer)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
