"""Processes for the scale-out tests (tests/integration/replicas/), and what the
tests do to them and read off them.

    with scale_out_topology(directory) as topology:     # serving up x2 engines, Redis, r0-r2
        topology.r0.in_rotation(0)                       # from one /metrics sample
        quota_usage(topology.redis.url, key_id)          # what Redis holds for a key
        with EngineControl(topology.up.engine_ports) as engines:
            engines.freeze(0) ... engines.kill(1)        # SIGSTOP / SIGKILL a vLLM server

Every process is a real one started the way an operator starts it (`serving up`,
`serving gateway`), on ports of its own; its output goes to a file in the test's directory,
whose tail failure messages quote.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx
import openai
import redis

from serving.engine.process import http_ok
from serving.gateway.quota import Scope
from serving.gateway.quota.redis_store import RedisQuotaStore
from serving.gateway.quota.store import ScopeUsage
from tests.gateway.quota.redis_server import RedisServer
from tests.integration.conftest import (
    MODEL,
    REPO,
    Samples,
    eventually,
    scrape,
    serving_env,
    total,
)
from tests.integration.scale_out_clients import SHORT as SHORT
from tests.integration.scale_out_clients import Load as Load
from tests.integration.scale_out_clients import Outcome as Outcome
from tests.integration.scale_out_clients import SseStream as SseStream
from tests.integration.scale_out_clients import Stopwatch as Stopwatch
from tests.integration.scale_out_clients import burst as burst
from tests.integration.scale_out_clients import stopwatch as stopwatch
from tests.integration.scale_out_engines import ENGINES_START_S as ENGINES_START_S
from tests.integration.scale_out_engines import EngineControl as EngineControl
from tests.integration.scale_out_engines import ServingUp as ServingUp
from tests.integration.scale_out_engines import listening_pid as listening_pid
from tests.integration.scale_out_engines import port_block as port_block
from tests.integration.scale_out_engines import start_serving_up as start_serving_up
from tests.integration.scale_out_engines import stop_serving_up as stop_serving_up
from tests.integration.scale_out_engines import wait_serving_up as wait_serving_up
from tests.integration.test_gateway_quota import create_key
from tests.ports import free_port

T = TypeVar("T")

# Only bounds how long a broken start hangs; never waited out when things work.
GATEWAY_START_S = 60.0
REDIS_TIMEOUT_S = 0.25
HEALTH_INTERVAL_S = 0.5
# vLLM's /health on this 2-core machine took up to 9.6 s while four streams ran on that
# engine (measured): the gateways whose engines stream give it 10 s, so a busy, healthy
# engine stays in their rotation; r2, through which engines are frozen on purpose, 4 s.
READINESS_TIMEOUT_S = 10.0
FREEZE_READINESS_TIMEOUT_S = 4.0
# How long a thawed engine may take to be back in every rotation: a health check that
# began before the thaw may still wait out two /health timeouts.
ROTATION_BUDGET_S = 3 * (HEALTH_INTERVAL_S + READINESS_TIMEOUT_S)
# A restarted engine loads again: about 40 s on an idle machine, 100 s on a busy one.
RESTART_BUDGET_S = 400.0
# Short, so a dead replica's leases expire soon; long enough that a replica starved of CPU
# for a few seconds on this machine still renews its leases in time.
LEASE_TTL_S = 10.0
# A short chat request: a few tokens, cheap for the engines.


def long_stream(
    max_tokens: int = 1800, *, usage: bool = False, running: bool = False
) -> dict[str, Any]:
    """A chat stream of `max_tokens` tokens (EOS ignored): one to ten seconds of the tiny
    model here, depending on what else runs. `usage`: vLLM's usage chunk at the end;
    `running`: vLLM's count so far in every chunk too."""
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me a long story."}],
        "max_tokens": max_tokens,
        "stream": True,
        "ignore_eos": True,
    }
    if usage or running:
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": running}
    return body


# -- ports and metrics ------------------------------------------------------------------


def refuses_connections(url: str) -> bool:
    """True when nothing listens behind `url` (its listener is closed)."""
    try:
        httpx.get(f"{url}/healthz", timeout=5)
    except httpx.ConnectError:
        return True
    except httpx.HTTPError:
        return False
    return False


# -- gateways ---------------------------------------------------------------------------


@dataclass
class Gateway:
    """A gateway process (`serving gateway`, or the one `serving up` runs)."""

    name: str
    url: str
    process: subprocess.Popen[Any]
    log: Path
    engine_urls: list[str]
    """--upstream's engines, in order: engine i's metric label is its host:port."""
    metrics_url: str
    """Its metrics port (--metrics-port), where the per-key series are."""

    def engine(self, index: int) -> str:
        return urlsplit(self.engine_urls[index]).netloc

    def metrics(self) -> Samples:
        return scrape(self.metrics_url)

    def value(self, name: str, **labels: str) -> float:
        """The series of `name` with exactly these labels (0 when absent)."""
        return self.metrics().get((name, frozenset(labels.items())), 0.0)

    def readyz(self) -> httpx.Response:
        return httpx.get(f"{self.url}/readyz", timeout=10)

    def client(self, secret: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=secret, max_retries=0, timeout=120)

    def post(self, secret: str, body: dict[str, Any], timeout: float = 120) -> httpx.Response:
        """One non-streaming request, its status and headers as the client sees them."""
        return httpx.post(
            f"{self.url}/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {secret}"},
            timeout=timeout,
        )

    def in_rotation(self, engine: int) -> bool:
        return self.value("gateway_engine_in_rotation", engine=self.engine(engine)) == 1

    def engine_gauges(self) -> list[float]:
        """Requests this gateway has on engine 0 and on engine 1 (0 for one it lacks)."""
        samples = self.metrics()
        return [
            samples.get(
                ("gateway_engine_in_flight_requests", frozenset({("engine", self.engine(e))})),
                0.0,
            )
            if e < len(self.engine_urls)
            else 0.0
            for e in (0, 1)
        ]

    def idle(self) -> bool:
        """No request in flight and no quota lease held (docs/architecture.md, reliability
        case 18)."""
        samples = self.metrics()
        return (
            samples.get(("gateway_in_flight_requests", frozenset()), 0.0) == 0
            and samples.get(("gateway_quota_leases", frozenset()), 0.0) == 0
        )

    def busy_gauges(self) -> dict[str, object]:
        """What `idle` and `engine_gauges` read, for failure messages."""
        return {
            "in_flight": self.value("gateway_in_flight_requests"),
            "leases": self.value("gateway_quota_leases"),
            "per engine": self.engine_gauges(),
        }

    def charged(self, key_id: str) -> float:
        """Tokens this gateway charged the key (prompt and completion)."""
        return total(self.metrics(), "gateway_tokens_total", key=key_id)

    def alive(self) -> bool:
        return self.process.poll() is None

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def terminate(self, timeout: float = 60) -> int:
        """SIGTERM (the gateway drains, then exits); its exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise


def terminate_all(gateways: Iterable[Gateway]) -> list[int]:
    """SIGTERM to every gateway first, then their exit codes: they drain side by side (each
    drain waits its drain delay), not one after another."""
    gateways = list(gateways)
    for gateway in gateways:
        if gateway.process.poll() is None:
            gateway.process.send_signal(signal.SIGTERM)
    return [gateway.terminate() for gateway in gateways]


def start_gateway(name: str, engines: list[str], directory: Path, *flags: str) -> Gateway:
    """`serving gateway` over `engines` on a free port, its metrics on another (returns at
    once: see `wait_up`)."""
    port, metrics_port = free_port(), free_port()
    log = directory / f"gateway-{name}.log"
    argv = [sys.executable, "-m", "serving.cli", "gateway", "--upstream", ",".join(engines)]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--metrics-port", str(metrics_port)]
    argv += flags
    with log.open("wb") as sink:
        process = subprocess.Popen(
            argv, env=serving_env(), cwd=REPO, stdout=sink, stderr=subprocess.STDOUT
        )
    metrics_url = f"http://127.0.0.1:{metrics_port}"
    return Gateway(name, f"http://127.0.0.1:{port}", process, log, engines, metrics_url)


def wait_up(gateway: Gateway, timeout: float = GATEWAY_START_S) -> None:
    deadline = time.monotonic() + timeout
    while not http_ok(f"{gateway.url}/healthz"):
        assert gateway.alive(), f"gateway {gateway.name} exited:\n{gateway.tail()}"
        assert time.monotonic() < deadline, f"gateway {gateway.name} not up:\n{gateway.tail()}"
        time.sleep(0.2)


# -- serving up -------------------------------------------------------------------------


def quota_usage(redis_url: str, key_id: str) -> ScopeUsage:
    """What Redis holds for a key now (in flight, requests and tokens in the minute window,
    tokens today), read with the gateway's own store from a fresh client."""

    async def read() -> ScopeUsage:
        store = RedisQuotaStore.from_url(redis_url, timeout_s=10)
        try:
            return await store.usage(Scope(key_id))
        finally:
            await store.close()

    return asyncio.run(read())


def leases_in_redis(redis_url: str) -> dict[str, int]:
    """Leases Redis still holds, per lease hash (`<ns>:{<key id>}:leases`): none left over
    once every request ended, however it ended."""
    client = redis.Redis.from_url(redis_url, socket_timeout=10)
    try:
        held = {str(name): int(client.hlen(name)) for name in client.scan_iter("*:leases")}
    finally:
        client.close()
    return {name: count for name, count in held.items() if count}


# -- time without stalls ----------------------------------------------------------------


@dataclass
class Topology:
    """`serving up` (two engines), Redis, and three gateway replicas sharing it:
    r0 fails closed and drains 2 s on SIGTERM; r1 fails closed, leases live LEASE_TTL_S;
    r2 fails local and gives /health FREEZE_READINESS_TIMEOUT_S."""

    up: ServingUp
    redis: RedisServer
    r0: Gateway
    r1: Gateway
    r2: Gateway
    replica_flags: list[str]
    """What every replica is started with (over the same engines, Redis and keys.db)."""

    @property
    def replicas(self) -> list[Gateway]:
        return [self.r0, self.r1, self.r2]

    def extra_replica(self, name: str, directory: Path, *flags: str) -> Gateway:
        """One more fail-closed replica, up and routing to both engines."""
        slow_health = ["--readiness-timeout-s", str(READINESS_TIMEOUT_S)]
        replica = start_gateway(
            name, self.up.engine_urls, directory, *self.replica_flags, *slow_health, *flags
        )
        wait_up(replica)
        eventually(lambda: replica.in_rotation(0) and replica.in_rotation(1), ROTATION_BUDGET_S)
        return replica

    def live_replicas(self) -> list[Gateway]:
        return [replica for replica in self.replicas if replica.alive()]

    def oracle_urls(self) -> tuple[list[str], list[str]]:
        gateways = [self.up.stack.gateway_url, *(r.url for r in self.live_replicas())]
        return gateways, self.up.engine_urls

    def key(self, name: str, *limits: str) -> tuple[str, str]:
        """`serving keys create --store` on the keys.db every gateway reads: (id, secret)."""
        return create_key(self.up.stack, name, *limits)

    def engines(self) -> EngineControl:
        """Control of both engines, once both serve (one may be restarting after a kill)."""
        self.back_in_rotation(RESTART_BUDGET_S)
        return EngineControl(self.up.engine_ports)

    def rejections(self, key_id: str, reason: str) -> float:
        return sum(
            replica.value("gateway_quota_rejections_total", key=key_id, reason=reason)
            for replica in self.live_replicas()
        )

    def store_errors(self) -> list[float]:
        return [r.value("gateway_quota_store_errors_total") for r in self.live_replicas()]

    def held_stream(
        self,
        gateway: Gateway,
        engines: EngineControl,
        key: Callable[[], tuple[str, str]],
        body: dict[str, Any] | None = None,
        attempts: int = 3,
    ) -> tuple[SseStream, str]:
        """A stream through `gateway`, held mid-way: every engine frozen as its third event
        arrives, and Redis counting it in flight then; with the id of the key it used.

        A client starved for a second or two on this machine can read its third event after
        the engine made, and the gateway relayed, the whole stream: then it is tried again,
        on a key from `key()` (a fresh one, unless the caller wants charges to add up)."""
        for _ in range(attempts):
            key_id, secret = key()
            before, already = quota_usage(self.redis.url, key_id).in_flight, engines.frozen
            stream = SseStream(gateway.url, secret, body or long_stream(), then=engines.freeze)
            stream.start().wait_events(3)
            if quota_usage(self.redis.url, key_id).in_flight == before + 1:
                return stream, key_id
            engines.thaw(*(engines.frozen - already))
            stream.stop()
            assert stream.done.wait(60)
            # Its charge settles before the next try: a caller on one key reads the key's
            # usage after this returns, and must find every try in it.
            eventually(functools.partial(self._in_flight_is, key_id, before))
        raise AssertionError(f"no stream was still running at its third event in {attempts}")

    def _in_flight_is(self, key_id: str, count: int) -> bool:
        return quota_usage(self.redis.url, key_id).in_flight == count

    def while_redis_answers(self, check: Callable[[], None], attempts: int = 3) -> None:
        """`check()`, whose limits hold exactly only while Redis answers every replica in
        time (otherwise the failure policy answers, which the Redis-away tests check). On
        this machine vLLM's decoding now and then starves every process, redis-server
        included, for over a second, past the 0.25 s bound: a run in which a replica saw a
        call fail is run again; a failure in a run where none did is a real one."""
        for _ in range(attempts):
            before = self.store_errors()
            try:
                check()
                return
            except AssertionError:
                if self.store_errors() == before:
                    raise
        raise AssertionError(f"Redis did not answer in time in any of {attempts} runs")

    def settled(self, *key_ids: str) -> None:
        """Every live replica idle, and Redis holding nothing for these keys, nor any lease."""
        for replica in self.live_replicas():
            wait_idle(replica)
        url = self.redis.url
        eventually(lambda: all(quota_usage(url, key_id).in_flight == 0 for key_id in key_ids))
        eventually(lambda: not leases_in_redis(url))

    def back_in_rotation(
        self, budget_s: float = 3 * (HEALTH_INTERVAL_S + READINESS_TIMEOUT_S)
    ) -> None:
        """Every live gateway routes to both engines (after a freeze or a restart)."""
        gateways = [self.up.gateway, *self.live_replicas()]
        eventually(lambda: all(g.in_rotation(0) and g.in_rotation(1) for g in gateways), budget_s)


def wait_idle(gateway: Gateway, *, engines: bool = False) -> None:
    """Until the gateway holds nothing (docs/architecture.md, reliability case 18), and with
    `engines` has nothing on any engine either; says what it still holds if not."""
    try:
        eventually(lambda: gateway.idle() and (not engines or gateway.engine_gauges() == [0, 0]))
    except AssertionError as exc:
        raise AssertionError(f"{gateway.name} not idle: {gateway.busy_gauges()}") from exc


@contextlib.contextmanager
def scale_out_topology(directory: Path) -> Iterator[Topology]:
    """The module's processes, started side by side; every one stopped at the end."""
    keys_db = directory / "keys.db"
    redis_server = RedisServer(directory / "redis")
    redis_server.start()
    up = start_serving_up(directory, keys_db, replicas=2, routing="least-loaded")
    common = [
        "--routing", "least-loaded", "--keys-db", str(keys_db),
        "--redis-url", redis_server.url, "--redis-replicas", "3",
        "--redis-timeout-s", str(REDIS_TIMEOUT_S), "--health-interval-s", str(HEALTH_INTERVAL_S),
    ]  # fmt: skip
    slow_health = ["--readiness-timeout-s", str(READINESS_TIMEOUT_S)]
    quick_health = ["--readiness-timeout-s", str(FREEZE_READINESS_TIMEOUT_S)]
    parts = {
        "r0": [*slow_health, "--drain-delay", "2"],
        "r1": [*slow_health, "--lease-ttl-s", str(LEASE_TTL_S)],
        "r2": [*quick_health, "--redis-failure-policy", "local"],
    }
    # Started while the engines load: they come up with no engine in rotation yet.
    r0, r1, r2 = (
        start_gateway(name, up.engine_urls, directory, *common, *flags)
        for name, flags in parts.items()
    )
    topology = Topology(up, redis_server, r0, r1, r2, common)
    try:
        for replica in topology.replicas:
            wait_up(replica)
        wait_serving_up(up)
        topology.back_in_rotation(60)
        yield topology
    finally:
        terminate_all(topology.live_replicas())
        if up.stack.process.poll() is None:
            stop_serving_up(up)
        redis_server.stop()
