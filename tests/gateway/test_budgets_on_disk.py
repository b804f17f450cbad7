"""Day and month budgets in keys.db with real `serving gateway` processes
(docs/architecture.md, quota semantics: "spending is recorded so that concurrent writers add up").

Two gateways share one keys.db and serve one key at the same time: after both stop, its rows
hold the sum of the usage both reported, and a third gateway starts from that sum. A gateway
killed with SIGKILL keeps the charges it had settled; the request it was still running is not
in the file (reservations are not spending).

The upstream is the fake vLLM server, not a real one: what is under test is the gateway's
bookkeeping of the usage an upstream reports (reservation, settlement, the journal's writes to
SQLite from several processes), and every expectation is the usage the responses themselves
carried. A real vLLM would only change how those numbers are produced, and needs a GPU.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from serving.gateway.keys import SqliteKeyStore
from serving.gateway.keys.record import KeySpec
from serving.gateway.openai_request import parse_completion_request
from serving.gateway.quota import Limits
from serving.gateway.quota.windows import utc_day
from tests.gateway.conftest import eventually
from tests.gateway.fake_upstream import FakeUpstream
from tests.gateway.servers import http_client
from tests.gateway.test_proxy_streaming import sse_events
from tests.ports import free_port

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[2]
# Generous on a busy 2-core machine; a passing run waits for conditions, never these.
START_S = 90.0
DEADLINE_S = 60.0
REQUESTS_PER_GATEWAY = 12  # half JSON, half streamed
CLIENTS_PER_GATEWAY = 3
# What the fake upstream reports: prompt 3 + completion 2 (JSON) or 3 + 4 words (streams).
JSON_TOKENS, STREAM_TOKENS = 5, 7
MESSAGES = [{"role": "user", "content": "hi"}]


class GatewayProcess:
    """`serving gateway` in a child process on a free port; its output goes to `log`."""

    def __init__(self, upstream: FakeUpstream, keys_db: Path, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = log.open("wb")
        env = {
            name: value
            for name, value in os.environ.items()
            if name != "SERVING_API_KEY" and not name.startswith("SERVING_GATEWAY_")
        }
        argv = [sys.executable, "-m", "serving.cli", "gateway", "--upstream", upstream.url,
                "--port", str(self.port), "--keys-db", str(keys_db), "--drain-delay", "0",
                "--log-level", "warning"]  # fmt: skip
        self.process = subprocess.Popen(
            argv, env=env, cwd=REPO, stdout=self._log, stderr=subprocess.STDOUT
        )
        self.log = log

    def ready(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"gateway exited early:\n{self.log.read_text()}")
        try:
            return httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    def stop(self, sig: signal.Signals) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout=DEADLINE_S)
        finally:
            self._log.close()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._log.close()


@pytest.fixture
def gateways() -> Iterator[list[GatewayProcess]]:
    """The gateways `start` started; any still running after the test are killed."""
    started: list[GatewayProcess] = []
    yield started
    for gateway in started:
        gateway.kill()


def start(
    started: list[GatewayProcess], upstream: FakeUpstream, keys: SqliteKeyStore, count: int
) -> list[GatewayProcess]:
    """`count` gateways on the key store's file, started together and ready."""
    new = [
        GatewayProcess(upstream, keys.path, keys.path.with_name(f"gateway-{len(started) + i}.log"))
        for i in range(count)
    ]
    started.extend(new)
    for gateway in new:
        assert eventually(gateway.ready, START_S), gateway.log.read_text()
    return new


def completion(url: str, secret: str, *, stream: bool) -> int:
    """One chat completion; the total tokens its response reported."""
    body: dict[str, object] = {"model": "fake", "messages": MESSAGES, "max_tokens": 4}
    with http_client(url, key=secret, timeout=DEADLINE_S) as http:
        if not stream:
            response = http.post("/v1/chat/completions", json=body)
            assert response.status_code == 200, response.text
            return int(response.json()["usage"]["total_tokens"])
        body |= {"stream": True, "stream_options": {"include_usage": True}}
        response = http.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
        events = sse_events(response.content)
        assert events[-1] == "[DONE]"
        usage = [json.loads(event).get("usage") for event in events[:-1]]
        return sum(int(found["total_tokens"]) for found in usage if found)


class Load:
    """Completions sent from several threads at once; `reported` sums their usage."""

    def __init__(self) -> None:
        self.reported = 0
        self.errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def send(self, url: str, secret: str, requests: int, clients: int) -> None:
        for client in range(clients):
            streams = [index % 2 == 1 for index in range(client, requests, clients)]
            thread = threading.Thread(target=self._client, args=(url, secret, streams))
            self._threads.append(thread)
            thread.start()

    def wait(self) -> int:
        for thread in self._threads:
            thread.join(DEADLINE_S)
            assert not thread.is_alive()
        if self.errors:
            raise self.errors[0]
        return self.reported

    def _client(self, url: str, secret: str, streams: list[bool]) -> None:
        try:
            for stream in streams:
                tokens = completion(url, secret, stream=stream)
                with self._lock:
                    self.reported += tokens
        except BaseException as exc:  # handed to the test thread by `wait`
            with self._lock:
                self.errors.append(exc)


def reserving(tokens: int) -> dict[str, object]:
    """A chat request whose reservation (prompt estimate + max_tokens) is `tokens`."""
    body: dict[str, object] = {"model": "fake", "messages": MESSAGES}
    estimate = parse_completion_request("chat", json.dumps(body).encode()).prompt_estimate
    return body | {"max_tokens": tokens - estimate}


def budget_rows(path: Path, key_id: str) -> dict[tuple[str, str], int]:
    """(model, kind) -> tokens summed over periods (a run may straddle UTC midnight)."""
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute(
            "SELECT model, kind, SUM(spent) FROM quota_budgets WHERE key_id = ?"
            " GROUP BY model, kind",
            (key_id,),
        ).fetchall()
    finally:
        conn.close()
    return {(model, kind): int(total) for model, kind, total in rows}


def all_rows(tokens: int, *models: str) -> dict[tuple[str, str], int]:
    return {(model, kind): tokens for model in ("", *models) for kind in ("day", "month")}


def test_two_gateways_on_one_keys_db_add_up(
    upstream: FakeUpstream, keys: SqliteKeyStore, gateways: list[GatewayProcess]
) -> None:
    day = utc_day(time.time())
    expected = 2 * (REQUESTS_PER_GATEWAY // 2) * (JSON_TOKENS + STREAM_TOKENS)
    headroom = 500  # what the third gateway finds left of the day
    record, secret = keys.create(
        KeySpec(
            "shared",
            limits=Limits(tokens_per_day=expected + headroom, tokens_per_month=1_000_000),
            model_limits={"fake": Limits(tokens_per_day=1_000_000)},
        )
    )
    first, second = start(gateways, upstream, keys, 2)

    load = Load()
    for gateway in (first, second):
        load.send(gateway.url, secret, REQUESTS_PER_GATEWAY, CLIENTS_PER_GATEWAY)
    reported = load.wait()
    assert reported == expected  # the fake upstream's usage, as the clients saw it
    for gateway in (first, second):  # uvicorn re-raises the signal once it has shut down
        assert gateway.stop(signal.SIGTERM) in (0, -signal.SIGTERM), gateway.log.read_text()
        assert "Traceback" not in gateway.log.read_text()
    assert budget_rows(keys.path, record.key_id) == all_rows(reported, "fake")

    # A gateway started now counts the day from what both wrote: exactly `headroom` is left.
    (third,) = start(gateways, upstream, keys, 1)
    with http_client(third.url, key=secret, timeout=DEADLINE_S) as http:
        one_over = http.post("/v1/chat/completions", json=reserving(headroom + 1))
        just_fits = http.post("/v1/chat/completions", json=reserving(headroom))
    if utc_day(time.time()) != day:
        return  # it became a new UTC day, which starts from 0: nothing left to compare
    assert one_over.status_code == 429, one_over.text
    error = one_over.json()["error"]
    assert error["code"] == "insufficient_quota"
    assert f"limit {expected + headroom}, used {reported}," in error["message"]
    assert just_fits.status_code == 200, just_fits.text


def test_a_killed_gateway_keeps_the_charges_it_settled(
    upstream: FakeUpstream, keys: SqliteKeyStore, gateways: list[GatewayProcess], token: str
) -> None:
    record, secret = keys.create(KeySpec("killed", limits=Limits(tokens_per_day=1_000_000)))
    (gateway,) = start(gateways, upstream, keys, 1)

    # A stream that stays open (the fake upstream holds it after one word) until the kill.
    running_errors: list[BaseException] = []

    def running() -> None:
        body = {"model": "gated", "messages": MESSAGES, "max_tokens": 4, "stream": True}
        try:
            with http_client(gateway.url, key=secret, timeout=DEADLINE_S) as http:
                http.post(f"/v1/chat/completions?t={token}", json=body)
        except httpx.TransportError:
            pass  # the gateway was killed under it: expected
        except BaseException as exc:
            running_errors.append(exc)

    stream = threading.Thread(target=running)
    stream.start()
    assert upstream.wait_for(f"{token}:started", DEADLINE_S)

    load = Load()
    load.send(gateway.url, secret, REQUESTS_PER_GATEWAY, CLIENTS_PER_GATEWAY)
    reported = load.wait()
    assert reported > 0
    # Settled charges reach the file by themselves (no flush, no shutdown) within a commit;
    # waiting for them is the condition, not a guess at how long that takes.
    assert eventually(
        lambda: budget_rows(keys.path, record.key_id) == all_rows(reported), DEADLINE_S
    ), budget_rows(keys.path, record.key_id)
    assert gateway.stop(signal.SIGKILL) == -signal.SIGKILL
    upstream.release(token)
    stream.join(DEADLINE_S)
    assert not running_errors
    # Still there after the kill, and without the stream that was running.
    assert budget_rows(keys.path, record.key_id) == all_rows(reported)
    assert "Traceback" not in gateway.log.read_text()
