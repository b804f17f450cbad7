"""Upstreams for the hop client's tests, in the test's own event loop.

    async with RawUpstream(answer) as upstream:      # answer(request, writer) per request
        pool = HopPool(upstream.url, ...)
    async with aiohttp_upstream(app) as url: ...     # a real aiohttp.web server

`RawUpstream` writes exactly the bytes a test gives it (faults, stale keep-alive, garbage) and
records every request and connection; `client_closed` is set when the client closed one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from types import TracebackType

from aiohttp import web

Answer = Callable[["Request", asyncio.StreamWriter], Awaitable[None]]


class Request:
    def __init__(self, head: bytes, body: bytes, connection: int) -> None:
        self.head = head
        self.body = body
        self.connection = connection
        """Which connection (0, 1, ...) it came on."""


class RawUpstream:
    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.requests: list[Request] = []
        self.connections = 0
        self.client_closed = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aenter__(self) -> RawUpstream:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        connection = self.connections
        self.connections += 1
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    self.client_closed.set()
                    return
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                body = await reader.readexactly(length) if length else b""
                request = Request(head, body, connection)
                self.requests.append(request)
                await self.answer(request, writer)
                if writer.is_closing():
                    return
        except ConnectionError:
            self.client_closed.set()
        except asyncio.CancelledError:
            pass  # stopped at the end of the test (asyncio's server would log it)
        finally:
            writer.close()
            self._tasks.discard(task)


@contextlib.asynccontextmanager
async def aiohttp_upstream(app: web.Application) -> AsyncIterator[str]:
    """`app` served by aiohttp on a random port; yields its base URL."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
