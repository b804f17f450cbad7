"""The hop client: keep-alive HTTP/1.1 connections to one upstream, pooled.

    pool = HopPool("http://127.0.0.1:8001", connect_timeout_s=5, idle_timeout_s=300,
                   keepalive_s=4)
    response = await pool.request("POST", b"/v1/completions", header_lines, body)
    try:
        body = await response.read_all()
    finally:
        response.close()       # back to the pool when read to its end, else closed
    await pool.close()

Not aiohttp: one upstream, bytes passed through, no cookies, redirects, decompression or
default headers, on `hop_connection` and httptools (docs/architecture.md, performance targets).

Rules:
- requests carry exactly the given header lines plus `host` and `content-length`;
- idle connections are reused newest first, for at most `keepalive_s` (below vLLM's own 5 s),
  closed by one pool timer; one older than `max_age_s` (0: no limit) is closed when its
  response ends, so behind a Kubernetes Service a terminating pod stops getting requests;
- a request on a reused connection that fails before a byte of the response is sent again,
  once, on a new connection;
- connecting takes at most `connect_timeout_s` (`HopConnectError`); `max_connections` > 0
  caps the connections in use (others wait); cancelling `request` closes its connection.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from urllib.parse import urlsplit

from serving.gateway.hop_connection import (
    HopConnectError,
    HopConnection,
    HopDisconnectedError,
    HopResponse,
)

_BODYLESS_METHODS = frozenset({"GET", "HEAD", "DELETE", "OPTIONS", "TRACE"})


class HopPool:
    def __init__(
        self,
        url: str,
        *,
        connect_timeout_s: float,
        idle_timeout_s: float,
        keepalive_s: float,
        max_connections: int = 0,
        max_age_s: float = 0.0,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._ssl: ssl.SSLContext | None = (
            ssl.create_default_context() if parts.scheme == "https" else None
        )
        self._prefix = parts.path.rstrip("/").encode("latin-1")
        self._host_line = b"host: " + parts.netloc.encode("latin-1") + b"\r\n"
        self._connect_timeout_s = connect_timeout_s
        self._idle_timeout_s = idle_timeout_s
        self._keepalive_s = keepalive_s
        self._max_age_s = max_age_s
        self._slots = asyncio.Semaphore(max_connections) if max_connections > 0 else None
        self._idle: list[HopConnection] = []
        self._sweeper: asyncio.TimerHandle | None = None
        self._closed = False

    async def request(
        self, method: str, target: bytes, header_lines: bytes, body: bytes = b""
    ) -> HopResponse:
        """Send a request and return its response once the headers are in.

        `target` is the raw `path?query` (appended to the URL's path), `header_lines` the
        request headers as `name: value\\r\\n` lines (no host or content-length).
        Raises a `HopError` when no response comes.
        """
        if self._closed:
            raise HopConnectError("the upstream client is closed")
        head = b"%s %s%s HTTP/1.1\r\n%s%s" % (
            method.encode("ascii"),
            self._prefix,
            target,
            self._host_line,
            header_lines,
        )
        if body or method not in _BODYLESS_METHODS:
            head += b"content-length: %d\r\n\r\n" % len(body)
        else:
            head += b"\r\n"
        data = head + body  # one write, one segment for a small request
        is_head = method == "HEAD"
        if self._slots is not None:
            await self._slots.acquire()
        connection = None
        try:
            connection = self._pooled()
            if connection is not None:
                try:
                    return await connection.exchange(data, head=is_head)
                except HopDisconnectedError as exc:
                    if not exc.before_response:
                        raise
                    # stale: the upstream closed it while idle; once more on a new one
                    connection.abandon()
            connection = await self._connect()
            return await connection.exchange(data, head=is_head)
        except BaseException:
            if connection is not None:
                connection.abandon()
            if self._slots is not None:
                self._slots.release()
            raise

    async def close(self) -> None:
        """Close the idle connections; those in use close when their response does."""
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()

    @property
    def idle_connections(self) -> int:
        return len(self._idle)

    def _pooled(self) -> HopConnection | None:
        idle = self._idle
        if not idle:
            return None
        now = asyncio.get_running_loop().time()
        while idle:
            connection = idle.pop()
            if connection.closed:
                continue
            if now - connection.idle_since < self._keepalive_s:
                return connection
            connection.close()
        return None

    async def _connect(self) -> HopConnection:
        loop = asyncio.get_running_loop()

        def protocol() -> HopConnection:
            return HopConnection(loop, idle_timeout_s=self._idle_timeout_s, on_done=self._done)

        try:
            async with asyncio.timeout(self._connect_timeout_s):
                transport, connection = await loop.create_connection(
                    protocol, self._host, self._port, ssl=self._ssl
                )
        except TimeoutError as exc:
            raise HopConnectError("connecting to the upstream timed out", timed_out=True) from exc
        except OSError as exc:
            raise HopConnectError(f"cannot connect to the upstream ({exc.strerror})") from exc
        connection.opened_at = loop.time()
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return connection

    def _done(self, connection: HopConnection, reusable: bool) -> None:
        if self._slots is not None:
            self._slots.release()
        if not reusable:
            return
        loop = connection.loop
        now = loop.time()
        if self._closed or (self._max_age_s and now - connection.opened_at >= self._max_age_s):
            connection.close()
            return
        connection.idle_since = now
        self._idle.append(connection)
        if self._sweeper is None:
            self._sweeper = loop.call_later(self._keepalive_s, self._sweep)

    def _sweep(self) -> None:
        """Close the idle connections whose keep-alive ran out (the pool's one timer)."""
        self._sweeper = None
        now = asyncio.get_running_loop().time()
        keep: list[HopConnection] = []
        for connection in self._idle:
            if connection.closed:
                continue
            if now - connection.idle_since >= self._keepalive_s:
                connection.close()
            else:
                keep.append(connection)
        self._idle = keep
        if keep:
            oldest = min(connection.idle_since for connection in keep)
            self._sweeper = asyncio.get_running_loop().call_at(
                oldest + self._keepalive_s, self._sweep
            )
