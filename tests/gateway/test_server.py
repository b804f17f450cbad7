"""The HTTP server: read deadlines and the drain (docs/architecture.md, reliability cases 12
and 16).

Slow-header and slow-body requests get 408 before any quota is touched; on SIGTERM readiness
fails first and in-flight streams finish.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from serving.gateway.keys import SqliteKeyStore
from serving.gateway.keys.record import KeySpec
from serving.gateway.quota import Limits
from serving.gateway.settings import GatewaySettings
from tests.gateway.conftest import GatewayFactory, eventually
from tests.gateway.fake_upstream import FakeUpstream
from tests.gateway.scrape import key_usage
from tests.gateway.servers import GatewayServer, closed_port
from tests.gateway.test_hardening import GATED
from tests.gateway.test_proxy_streaming import sse_events

pytestmark = pytest.mark.timeout(30)

REPO = Path(__file__).resolve().parents[2]


def raw_exchange(gateway: GatewayServer, request: bytes, wait: float = 5) -> bytes:
    """Send raw bytes, then read until the server closes the connection."""
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=wait) as sock:
        sock.sendall(request)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
        return received


def test_slow_headers_get_408_and_the_connection_is_closed(strict: GatewayServer) -> None:
    started = time.monotonic()
    answer = raw_exchange(strict, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert b"request_timeout" in answer
    assert 0.25 < time.monotonic() - started < 3
    assert raw_exchange(strict, b"").startswith(b"HTTP/1.1 408 ")  # connected, said nothing


def test_slow_body_gets_408_before_quota(
    strict: GatewayServer, keys: SqliteKeyStore, upstream: FakeUpstream, token: str
) -> None:
    record, secret = keys.create(KeySpec("t", limits=Limits(rpm=1)))
    head = (
        f"POST /v1/chat/completions?t={token} HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {secret}\r\nContent-Length: 100\r\n\r\n"
    ).encode()
    answer = raw_exchange(strict, head + b'{"model":')
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert b"request_timeout" in answer
    assert key_usage(strict, record.key_id) == (0, 0, 0, 0)
    assert not upstream.seen(f"{token}:started")


def _health_on(sock: socket.socket) -> bytes:
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    answer = b""
    while not answer.endswith(b'{"status":"ok"}'):
        chunk = sock.recv(65536)
        assert chunk, f"closed after {answer!r}"
        answer += chunk
    return answer


def test_an_idle_connection_is_kept_for_the_keepalive_timeout_then_closed(
    make_gateway: GatewayFactory,
) -> None:
    gateway = make_gateway(keepalive_timeout_s=1)
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as sock:
        assert _health_on(sock).startswith(b"HTTP/1.1 200 ")
        time.sleep(0.5)  # idle, within the timeout: the same connection serves the next one
        assert _health_on(sock).startswith(b"HTTP/1.1 200 ")
        answered = time.monotonic()
        assert sock.recv(1) == b""  # then the gateway closes it, not at uvicorn's 5 s
        assert 0.9 < time.monotonic() - answered < 4.5


def test_the_default_keepalive_outlasts_client_pools_and_load_balancers() -> None:
    # aiohttp keeps an idle connection 15 s, httpx 5 s, a cloud load balancer 60 s: a
    # gateway that closed first would race the next request sent on it.
    assert GatewaySettings.model_fields["keepalive_timeout_s"].default > 60


# -- draining (case 12) ----------------------------------------------------------------


def stream_in_background(url: str, key: str, token: str, into: list[bytes]) -> threading.Thread:
    def run() -> None:
        with httpx.Client(timeout=20, headers={"Authorization": f"Bearer {key}"}) as http:
            into.append(http.post(f"{url}/v1/chat/completions?t={token}", json=GATED).content)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def readyz(url: str) -> int:
    try:
        return httpx.get(f"{url}/readyz", timeout=2).status_code
    except httpx.TransportError:
        return 0


def test_sigterm_fails_readiness_first_and_lets_streams_finish(
    make_gateway: GatewayFactory, upstream: FakeUpstream, token: str
) -> None:
    gateway = make_gateway(drain_delay_s=0.5, graceful_shutdown_s=10)
    received: list[bytes] = []
    streaming = stream_in_background(gateway.url, "sk-test-0123456789", token, received)
    assert upstream.wait_for(f"{token}:started", 5)
    assert readyz(gateway.url) == 200
    gateway.in_loop(lambda: gateway.server.handle_exit(signal.SIGTERM, None))
    assert readyz(gateway.url) == 503  # still listening, no longer ready
    assert eventually(lambda: readyz(gateway.url) == 0)  # then the listener closes
    upstream.release(token)
    streaming.join(10)
    assert sse_events(received[0])[-1] == "[DONE]"


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGHUP])
def test_a_real_stop_signal_drains_serving_gateway(
    upstream: FakeUpstream, token: str, tmp_path: Path, stop: signal.Signals
) -> None:
    port, key = closed_port(), "sk-drain-test-key"
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "serving.cli", "gateway", "--upstream", upstream.url,
            "--port", str(port), "--keys-db", str(tmp_path / "keys.db"), "--drain-delay", "1",
            "--log-level", "warning"]  # fmt: skip
    env = {**os.environ, "SERVING_API_KEY": key}
    process = subprocess.Popen(argv, env=env, cwd=REPO)
    try:
        assert eventually(lambda: readyz(url) == 200, timeout=20)
        received: list[bytes] = []
        streaming = stream_in_background(url, key, token, received)
        assert upstream.wait_for(f"{token}:started", 5)
        process.send_signal(stop)
        assert eventually(lambda: readyz(url) == 503, timeout=2)
        assert process.poll() is None
        upstream.release(token)
        streaming.join(10)
        assert sse_events(received[0])[-1] == "[DONE]"
        process.wait(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
