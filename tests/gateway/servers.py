"""The gateway on a real uvicorn server in a thread, and clients and ports for tests."""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import httpx
import uvicorn

from serving.gateway.app import GatewayApp, create_app
from serving.gateway.quota import Clock
from serving.gateway.route_table import ROUTES, RouteTable
from serving.gateway.server import DrainingServer, build_server
from serving.gateway.settings import GatewaySettings

T = TypeVar("T")

TEST_KEY = "sk-test-0123456789"
OTHER_KEY = "sk-test-other-key"

# Plain-HTTP test clients need no CA bundle; loading one costs ~50 ms per httpx.Client.
_NO_CA = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)


def http_client(base_url: str, *, key: str | None = TEST_KEY, timeout: float = 10) -> httpx.Client:
    """An httpx client for a test server, sending `key` as a Bearer token unless None."""
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    return httpx.Client(base_url=base_url, headers=headers, timeout=timeout, verify=_NO_CA)


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def listening_socket(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A socket listening on `host` (loopback) on `port` (0: a random free one)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    return sock


class GatewayServer:
    """The real gateway (uvicorn, uvloop, httptools) serving `settings` on a random port;
    `clock` drives its quota windows."""

    def __init__(
        self,
        settings: GatewaySettings,
        *,
        clock: Clock | None = None,
        access_log: bool = False,
        routes: RouteTable = ROUTES,
    ) -> None:
        self.settings = settings
        self.app: GatewayApp = create_app(settings, clock=clock, routes=routes)
        self.server: DrainingServer = build_server(
            settings, app=self.app, log_level="warning", access_log=access_log
        )
        self._server: uvicorn.Server = self.server
        self._sock = listening_socket()
        self.port: int = self._sock.getsockname()[1]
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with asyncio.Runner(loop_factory=self._server.config.get_loop_factory()) as runner:
            runner.run(self._main())

    async def _main(self) -> None:
        self.loop = asyncio.get_running_loop()
        await self._server.serve(sockets=[self._sock])

    def in_loop(self, function: Callable[[], T]) -> T:
        """`function()` run on the server's event loop (where the app's state lives)."""
        assert self.loop is not None

        async def call() -> T:
            return function()

        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(5)

    def await_in_loop(self, coroutine: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """`await coroutine()` on the server's event loop (the quota store's calls)."""
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coroutine(), self.loop).result(5)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("gateway did not start")
            time.sleep(0.005)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(10)
        self._sock.close()
