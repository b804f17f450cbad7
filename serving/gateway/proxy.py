"""Forward one request to the upstream and relay the response back as it arrives
(docs/architecture.md, the request path, steps 10 and 11).

    outcome = await Proxy(router, retry_after_s=1).forward(request, receive, send)

Rules:
- a client that goes away cancels the exchange, which closes the upstream connection so vLLM
  aborts the request; its watcher starts only after one to two `WATCH_TICK_S` ticks of one
  shared timer, so short requests never pay for one;
- one `await send` per chunk, so a slow client slows the upstream read (backpressure);
- an upstream error with a body the route's API words passes through (`ProxyRequest.dialect`:
  OpenAI-shaped, or re-worded for Anthropic's); every other failure is
  raised as a `GatewayError` for the app's error boundary (the proxy writes no error
  response of its own);
- no response, or a 5xx before a byte was relayed: sent once more to another engine; once a
  byte reached the client nothing is replayed;
- every response carries `request.response_headers`; a redirect to the upstream is made
  relative.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from serving.gateway.api_dialect import OPENAI, Dialect
from serving.gateway.errors import (
    UPSTREAM_FAILURES,
    GatewayError,
    UpstreamUnavailableError,
    map_upstream_exception,
    wrap_upstream_status,
)
from serving.gateway.forwarded_headers import client_response_headers, upstream_request_headers
from serving.gateway.hop_connection import HopConnectError, HopResponse
from serving.gateway.responses import send_bytes
from serving.gateway.routing import Engine, Router
from serving.gateway.types import RawHeaders, Receive, Send
from serving.gateway.usage import ResponseMeter

logger = logging.getLogger(__name__)

# Upstream 2xx bodies up to this size with a declared length are relayed in one piece.
WHOLE_BODY_LIMIT = 1024 * 1024
# Upstream error bodies are read up to this size to see whether they are OpenAI-shaped.
ERROR_BODY_LIMIT = 64 * 1024
# Every tick, requests that were already running at the previous one get a task watching
# for their client's disconnect.
WATCH_TICK_S = 0.05
# A client that stopped reading and went away: what the upstream sent meanwhile is read and
# metered (not relayed) for at most this long, or until nothing came for DRAIN_IDLE_S.
DRAIN_S = 1.0
DRAIN_IDLE_S = 0.2


@dataclass(slots=True)
class ProxyRequest:
    """A client request, its body already read, as the proxy forwards it. Treat it as
    immutable (`dataclasses.replace` for a changed copy); not frozen only because a frozen
    dataclass's `__init__` is slower, and one runs twice per request."""

    method: str
    target: bytes
    """Raw path and query, still percent-encoded: ``/v1/models?x=1``."""
    headers: RawHeaders
    body: bytes
    request_id: bytes
    response_headers: RawHeaders = field(default_factory=list)
    """Added to every response the client gets, error or not."""
    meter: ResponseMeter | None = None
    """Reads usage out of 2xx bodies (metered endpoints only)."""
    prefixes: Sequence[int] = ()
    """The prompt's prefix hashes, for affinity routing (`routing.prefix_affinity`)."""
    engines: frozenset[int] | None = None
    """Ids of the engines that serve the request's model (an adapter may be on some only);
    None: any engine."""
    dialect: Dialect = OPENAI
    """The API the route speaks: which upstream error bodies pass, and how they are worded."""


@dataclass(slots=True)
class ProxyOutcome:
    """What happened, filled in as it happens (for logs and, later, metrics and settling)."""

    status: int = 0
    """Status sent to the client; 0 when nothing was sent."""
    upstream_status: int | None = None
    error: GatewayError | None = None
    """The failure the proxy raised (the error boundary answers it)."""
    open_event: bool = True
    """A half-sent event may be open, so an error event must end it first; False only when
    the proxy saw its last relayed chunk end an event (a bug elsewhere leaves it unknown)."""
    client_disconnected: bool = False
    sse: bool = False
    """The response was relayed as a server-sent event stream."""
    forwarded_at: float = 0.0
    first_byte_at: float = 0.0
    upstream_done_at: float = 0.0
    """`time.perf_counter()` readings; 0.0 when it did not happen."""
    engine: Engine | None = None
    """The engine the request was last sent to."""


class Proxy:
    def __init__(self, router: Router, *, retry_after_s: int) -> None:
        self.router = router
        self._retry_after_s = retry_after_s
        self._watches: set[_DisconnectWatch] = set()
        self._tick = 0
        self._ticker: asyncio.TimerHandle | None = None

    async def forward(
        self,
        request: ProxyRequest,
        receive: Receive,
        send: Send,
        outcome: ProxyOutcome | None = None,
    ) -> ProxyOutcome:
        """Relay `request` to the upstream and its response to `send`; a client that
        disconnects meanwhile cancels the exchange (which closes the upstream response).
        `outcome` (default: a new one) is filled in as it happens, so a caller that owns it
        still knows how far the exchange got when this raises."""
        if outcome is None:
            outcome = ProxyOutcome()
        task = asyncio.current_task()
        assert task is not None
        watch = _DisconnectWatch(receive, task, outcome, self._tick)
        watches = self._watches
        watches.add(watch)
        if self._ticker is None:
            self._ticker = task.get_loop().call_later(WATCH_TICK_S, self._on_tick)
        try:
            await self._exchange(request, send, outcome)
        except asyncio.CancelledError:
            # Absorb the one cancellation the watcher made; any other one propagates.
            if not outcome.client_disconnected or task.uncancel() > 0:
                raise
            logger.info("request %s: client disconnected", request.request_id.decode())
        finally:
            watches.discard(watch)
            if watch.watcher is not None:
                watch.watcher.cancel()
        return outcome

    def _on_tick(self) -> None:
        """Start watchers for the requests running since before the previous tick."""
        tick = self._tick
        self._tick = tick + 1
        for watch in self._watches:
            if watch.tick < tick and watch.watcher is None:
                watch.start()
        self._ticker = (
            asyncio.get_running_loop().call_later(WATCH_TICK_S, self._on_tick)
            if self._watches
            else None
        )

    async def _exchange(self, request: ProxyRequest, send: Send, outcome: ProxyOutcome) -> None:
        outcome.forwarded_at = time.perf_counter()
        router = self.router
        engine = router.choose(request.prefixes, among=request.engines)
        if engine is None:
            raise self._fail(self._no_engine(), request, outcome)
        header_lines = upstream_request_headers(request.headers, request.request_id)
        retried = False
        while True:
            attempt = engine  # `engine` moves on to the failover target inside the try
            outcome.engine = attempt
            attempt.requests += 1
            attempt.in_flight += 1
            try:
                try:
                    response = await engine.client.pool.request(
                        request.method, request.target, header_lines, request.body
                    )
                except UPSTREAM_FAILURES as exc:
                    if isinstance(exc, HopConnectError):
                        router.connect_failed(engine, str(exc), timed_out=exc.timed_out)
                    other = (
                        None
                        if retried
                        else router.choose(request.prefixes, exclude=engine, among=request.engines)
                    )
                    if other is None:
                        failure = exc if router.unready_reason is None else self._no_engine()
                        raise self._fail(failure, request, outcome) from None
                    self._failover(engine, other, request, type(exc).__name__)
                    engine, retried = other, True
                    continue
                if response.status >= 500 and not retried:
                    other = router.choose(request.prefixes, exclude=engine, among=request.engines)
                    if other is not None:
                        response.close()  # unread: the connection is closed, not reused
                        self._failover(engine, other, request, f"status {response.status}")
                        engine, retried = other, True
                        continue
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
                    # Released (back to the pool) when the body was read to its end;
                    # otherwise, e.g. when cancelled, the connection is closed and the
                    # upstream sees it.
                    response.close()
                return
            finally:
                attempt.in_flight -= 1

    def _no_engine(self) -> UpstreamUnavailableError:
        return UpstreamUnavailableError(
            "No model server is available; retry later.", retry_after_s=self._retry_after_s
        )

    def _failover(self, engine: Engine, other: Engine, request: ProxyRequest, why: str) -> None:
        engine.failovers += 1
        logger.warning(
            "request %s: engine %s failed before responding (%s); sent to engine %s",
            request.request_id.decode(),
            engine.label,
            why,
            other.label,
        )

    async def _relay_whole(
        self,
        response: HopResponse,
        request: ProxyRequest,
        send: Send,
        outcome: ProxyOutcome,
    ) -> None:
        try:
            body = await response.read_all()
        except UPSTREAM_FAILURES as exc:
            raise self._fail(exc, request, outcome) from None
        outcome.upstream_done_at = time.perf_counter()
        if request.meter is not None:
            request.meter.read_json(body)
        headers = self._response_headers(response, request)
        headers.append((b"content-length", str(len(body)).encode()))
        outcome.status = response.status
        await send({"type": "http.response.start", "status": response.status, "headers": headers})
        outcome.first_byte_at = time.perf_counter()
        await send({"type": "http.response.body", "body": body, "more_body": False})

    async def _relay_stream(
        self,
        response: HopResponse,
        request: ProxyRequest,
        send: Send,
        outcome: ProxyOutcome,
    ) -> None:
        headers = self._response_headers(response, request)
        outcome.status = response.status
        sse = outcome.sse = response.content_type == b"text/event-stream"
        meter = request.meter
        await send({"type": "http.response.start", "status": response.status, "headers": headers})
        last = b"\n\n"
        first = True
        sending = False
        try:
            while chunk := await response.read():
                if meter is not None:
                    if sse:
                        chunk = meter.feed(chunk)
                        if not chunk:
                            continue
                    else:
                        meter.feed_other(chunk)
                last = chunk
                if first:
                    first = False
                    outcome.first_byte_at = time.perf_counter()
                sending = True
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                sending = False
        except asyncio.CancelledError:
            # Behind: cancelled while a send waited for the client, or the upstream had to
            # wait for us (the server may wake the send before the watcher on a disconnect).
            behind = sending or response.held_back
            if behind and sse and meter is not None and outcome.client_disconnected:
                await _drain(response, meter)
            raise
        except UPSTREAM_FAILURES as exc:
            if meter is not None:
                meter.discard_pending()
            outcome.open_event = not last.endswith((b"\n\n", b"\r\n\r\n"))
            raise self._fail(exc, request, outcome) from None
        outcome.upstream_done_at = time.perf_counter()
        rest = b""
        if meter is not None:
            if outcome.sse:
                rest = meter.end()
            else:
                meter.end_other()
        await send({"type": "http.response.body", "body": rest, "more_body": False})

    async def _relay_error(
        self,
        response: HopResponse,
        request: ProxyRequest,
        send: Send,
        outcome: ProxyOutcome,
    ) -> None:
        chunks: list[bytes] = []
        size = 0
        try:
            while chunk := await response.read():
                chunks.append(chunk)
                size += len(chunk)
                if size > ERROR_BODY_LIMIT:
                    break
        except UPSTREAM_FAILURES as exc:
            raise self._fail(exc, request, outcome) from None
        outcome.upstream_done_at = time.perf_counter()
        passed = request.dialect.upstream_error(response.status, b"".join(chunks))
        if passed is not None:
            status, body = passed
            outcome.status = status
            await send_bytes(
                send,
                status,
                body,
                request_id=request.request_id,
                headers=request.response_headers,
            )
            return
        error = wrap_upstream_status(response.status, b"".join(chunks))
        logger.warning(
            "request %s: upstream answered %d without an error body its API words",
            request.request_id.decode(),
            response.status,
        )
        outcome.error = error
        raise error

    def _response_headers(self, response: HopResponse, request: ProxyRequest) -> RawHeaders:
        headers = client_response_headers(response.headers, request.request_id)
        if 300 <= response.status < 400:
            headers = [
                (name, self.router.gateway_location(value) if name == b"location" else value)
                for name, value in headers
            ]
        headers.extend(request.response_headers)
        return headers

    def _fail(self, exc: Exception, request: ProxyRequest, outcome: ProxyOutcome) -> GatewayError:
        """The error the failure `exc` is reported as, logged and recorded in `outcome`
        (the caller raises it)."""
        outcome.upstream_done_at = time.perf_counter()
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


async def _drain(response: HopResponse, meter: ResponseMeter) -> None:
    """Meter what the upstream already sent but the client never read, then let it go.

    vLLM does not wait for a slow reader: it goes on generating and merges what was not
    read yet into its next event. When a client that stopped reading goes away, those
    tokens were made all the same and are charged: read (never relayed) until the stream
    ends or nothing comes for `DRAIN_IDLE_S`; closing the response afterwards is what aborts
    the request in vLLM. A drain still reading after `DRAIN_S` (or failing) never caught up
    with what vLLM made: the meter is marked `overtaken`, and the request is charged its
    bound."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DRAIN_S
    meter.strip_chunk_usage = False  # nothing is relayed any more
    try:
        while (left := deadline - loop.time()) > 0:
            chunk = await asyncio.wait_for(response.read(), min(left, DRAIN_IDLE_S))
            if not chunk:
                return
            meter.feed(chunk)
    except TimeoutError:
        if deadline - loop.time() > 0:  # idle: vLLM had nothing more to send
            return
    except UPSTREAM_FAILURES:
        pass
    meter.overtaken = True


class _DisconnectWatch:
    """Started by the proxy's tick once the request has run for a tick: a task that cancels
    the request's task when the ASGI server reports that the client went away (the exchange
    itself runs in the request's own task)."""

    __slots__ = ("_outcome", "_receive", "_task", "tick", "watcher")

    def __init__(
        self, receive: Receive, task: asyncio.Task[object], outcome: ProxyOutcome, tick: int
    ) -> None:
        self._receive = receive
        self._task = task
        self._outcome = outcome
        self.tick = tick
        """The tick during which the request started."""
        self.watcher: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.watcher = self._task.get_loop().create_task(self._watch())

    async def _watch(self) -> None:
        while (await self._receive())["type"] != "http.disconnect":
            pass
        self._outcome.client_disconnected = True
        self._task.cancel()
