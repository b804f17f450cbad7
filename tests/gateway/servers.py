"""The gateway on a real uvicorn server in a thread, and clients and ports for tests."""

from __future__ import annotations

import socket
import ssl
import threading
import time

import httpx
import uvicorn

from serving.gateway.command import build_server
from serving.gateway.settings import GatewaySettings

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


def listening_socket() -> socket.socket:
    """A socket listening on 127.0.0.1 on a random free port."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    return sock


class GatewayServer:
    """The real gateway (uvicorn, uvloop, httptools) serving `settings` on a random port."""

    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings
        self._server: uvicorn.Server = build_server(settings, log_level="warning")
        self._sock = listening_socket()
        self.port: int = self._sock.getsockname()[1]
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )

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
