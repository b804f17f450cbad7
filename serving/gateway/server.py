"""The gateway's HTTP server: uvicorn (uvloop, httptools) with a header deadline and a drain.

    server = build_server(settings)            # or build_server(settings, app=create_app(...))
    server.run()                               # until SIGINT/SIGTERM

Two things uvicorn does not do by itself:
- read deadlines: a connection that does not deliver a request's headers within
  `header_timeout_s` (from connecting, or from the request's first byte), or its body within
  `body_timeout_s` after them, gets a 408 and is closed, so slow clients cannot hold
  connections (or, with a half-sent body, a request) open;
- a drain on SIGTERM: readiness fails at once (`app.begin_drain()`), requests keep being
  served for `drain_delay_s` so that load balancers stop sending new ones, then uvicorn's
  graceful shutdown stops listening and lets in-flight requests (streams too) finish for up
  to `graceful_shutdown_s`. SIGINT (Ctrl-C) skips the delay; a second signal exits at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import signal
import threading
import time
from collections.abc import Iterator
from types import FrameType
from typing import Any

import uvicorn
from uvicorn.config import LOGGING_CONFIG
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from serving.gateway.app import GatewayApp, create_app
from serving.gateway.errors import RequestTimeoutError
from serving.gateway.response_head import cork_head
from serving.gateway.settings import GatewaySettings


def build_server(
    settings: GatewaySettings,
    *,
    app: GatewayApp | None = None,
    log_level: str = "info",
    access_log: bool = False,
) -> DrainingServer:
    """A server running `app` (default: `create_app(settings)`)."""
    app = app or create_app(settings)
    # uvicorn's own logging, plus the gateway's loggers on the same handler and level.
    log_config = copy.deepcopy(LOGGING_CONFIG)
    log_config["loggers"]["serving"] = {
        "handlers": ["default"],
        "level": log_level.upper(),
        "propagate": False,
    }
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        http=deadline_protocol(settings.header_timeout_s, settings.body_timeout_s),
        ws="none",
        lifespan="on",
        log_config=log_config,
        log_level=log_level,
        access_log=access_log,
        # The gateway never reads the client's address (keys identify callers), so uvicorn's
        # X-Forwarded-For rewriting would be a middleware hop per request for nothing.
        proxy_headers=False,
        # No `server: uvicorn` on every answer: it tells clients nothing they need and
        # attackers which server to look up.
        server_header=False,
        timeout_graceful_shutdown=settings.graceful_shutdown_s,
        timeout_keep_alive=settings.keepalive_timeout_s,
    )
    return DrainingServer(config, app=app, drain_delay_s=settings.drain_delay_s)


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, *, app: GatewayApp, drain_delay_s: float) -> None:
        super().__init__(config)
        self.app = app
        self._drain_delay_s = drain_delay_s
        self._drain_until: float | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.app.begin_drain()
        first = self._drain_until is None and not self.should_exit
        if first and sig == signal.SIGTERM and self._drain_delay_s > 0:
            self._drain_until = time.monotonic() + self._drain_delay_s
            return
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """uvicorn's (SIGINT, SIGTERM), and SIGHUP (a closed terminal, a dropped ssh session)
        drains as SIGTERM does instead of killing the gateway mid-request."""
        if threading.current_thread() is not threading.main_thread():
            with super().capture_signals():
                yield
            return
        previous = signal.signal(
            signal.SIGHUP, lambda _, frame: self.handle_exit(signal.SIGTERM, frame)
        )
        try:
            with super().capture_signals():
                yield
        finally:
            signal.signal(signal.SIGHUP, previous)

    async def on_tick(self, counter: int) -> bool:
        if self._drain_until is not None and time.monotonic() >= self._drain_until:
            self._drain_until = None
            super().handle_exit(signal.SIGTERM, None)
        return await super().on_tick(counter)


def _timeout_response(what: str) -> bytes:
    body = RequestTimeoutError(f"The request {what} did not arrive in time.").body()
    head = "HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
    head += f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    return head.encode() + body


_TIMEOUT_RESPONSES = {"headers": _timeout_response("headers"), "body": _timeout_response("body")}


def deadline_protocol(header_timeout_s: float, body_timeout_s: float) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol with read deadlines: a request's headers must arrive
    within `header_timeout_s` (from connecting, or from its first byte), its body within
    `body_timeout_s` after that; otherwise 408 and the connection is closed.

    Per request this costs two float stores; one timer per server sweeps the connections a
    few times per deadline (so a deadline is enforced within a quarter of itself, at most 1 s
    late) instead of a timer armed and cancelled per request.
    """
    interval = min(1.0, header_timeout_s / 4, body_timeout_s / 4)
    sweeping = [False]

    class DeadlineProtocol(HttpToolsProtocol):
        _deadline = 0.0  # loop time; 0.0: none
        _awaiting = "headers"

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._deadline = self.loop.time() + header_timeout_s
            if not sweeping[0]:
                sweeping[0] = True
                self.loop.call_later(interval, sweep, self.loop, self.connections)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._deadline, self._awaiting = self.loop.time() + header_timeout_s, "headers"

        def on_headers_complete(self) -> None:
            self._deadline, self._awaiting = self.loop.time() + body_timeout_s, "body"
            super().on_headers_complete()
            if self.cycle is not None:  # None only when the connection was upgraded
                cork_head(self.cycle, self.loop)

        def on_message_complete(self) -> None:
            self._deadline = 0.0
            super().on_message_complete()

        def expire(self) -> None:
            self._deadline = 0.0
            if self.transport.is_closing():
                return
            if self.cycle is None or not self.cycle.response_started:
                self.transport.write(_TIMEOUT_RESPONSES[self._awaiting])
            self.transport.close()

    def sweep(loop: asyncio.AbstractEventLoop, connections: set[Any]) -> None:
        now = loop.time()
        for connection in list(connections):
            if isinstance(connection, DeadlineProtocol) and 0.0 < connection._deadline <= now:
                connection.expire()
        if connections:
            loop.call_later(interval, sweep, loop, connections)
        else:
            sweeping[0] = False

    return DeadlineProtocol
