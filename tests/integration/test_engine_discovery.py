"""Engine discovery as Kubernetes would run it, without a cluster: two real vLLM engines on
their own loopback addresses (127.0.0.2, 127.0.0.3) and one port, like a headless Service's
pods; a real DNS server (dnsmasq) answering the Service's name with the engines' addresses;
a real gateway process given `--upstream dns+http://NAME:PORT` (and `--discovery-allow-local
true`: a loopback answer is dropped without it). The name's answer changes under load as KEDA
adding and removing pods would change it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import psutil
import pytest

from serving.engine.process import http_ok
from tests.gateway.routing.dns_server import DOMAIN, DnsServer
from tests.integration.conftest import (
    MODEL,
    REPO,
    TEST_KEY,
    descendants,
    eventually,
    serving_env,
    total,
)
from tests.integration.scale_out import Gateway, long_stream, start_gateway, wait_up
from tests.integration.scale_out_clients import SseStream
from tests.ports import free_port

pytestmark = pytest.mark.dns

NAME = f"engines.{DOMAIN}"
HOSTS = ("127.0.0.2", "127.0.0.3")
ENGINE_START_S = 600
# A join or a drain shows within a lookup (every second: dnsmasq's TTL) and a health probe.
CHANGE_S = 30


@dataclass
class Topology:
    dns: DnsServer
    port: int
    gateway: Gateway

    def url(self, host: str) -> str:
        return f"http://{host}:{self.port}"

    def label(self, host: str) -> str:
        return f"{host}:{self.port}"

    def series(self, name: str) -> dict[str, float]:
        """`name` per engine label, as the gateway exports it now."""
        return {
            dict(labels)["engine"]: sample
            for (metric, labels), sample in self.gateway.metrics().items()
            if metric == name
        }

    def sent(self) -> dict[str, float]:
        return self.series("gateway_engine_requests_total")

    def healthy(self) -> float:
        return self.gateway.value("gateway_engines_healthy")

    def known(self) -> float:
        return self.gateway.value("gateway_engines_known")

    def charged(self) -> float:
        """Completion tokens the gateway charged its key so far."""
        return total(self.gateway.metrics(), "gateway_tokens_total", kind="completion")

    def client(self) -> openai.OpenAI:
        return self.gateway.client(TEST_KEY)

    def oracle_urls(self) -> tuple[list[str], list[str]]:
        """The gateway and every pod's engine (discovered or not): the accounting oracle."""
        return [self.gateway.url], [self.url(host) for host in HOSTS]


@contextmanager
def loopback_engine(host: str, port: int, log: Path) -> Iterator[subprocess.Popen[str]]:
    """`serving engine` bound to `host` (a pod's address); stopped with its workers at the end.
    Its launcher restarts vLLM when it dies (a container restart), as in a pod."""
    with log.open("w") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "serving.cli", "engine", "--profile", "cpu-tiny",
             "--host", host, "--port", str(port), "--metrics-port", str(free_port())],
            env=serving_env(), cwd=REPO, stdout=sink, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
    try:
        yield process
    finally:
        children = descendants(process.pid)
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=90)
        except subprocess.TimeoutExpired:
            process.kill()
        _, alive = psutil.wait_procs(children, timeout=30)
        for leftover in alive:
            leftover.kill()


def api_server(host: str, port: int) -> int:
    """The pid of the vLLM API server listening on host:port."""
    for connection in psutil.net_connections("tcp"):
        laddr = connection.laddr
        if (
            connection.status == psutil.CONN_LISTEN
            and laddr
            and (laddr.ip, laddr.port) == (host, port)
            and connection.pid is not None
        ):
            return connection.pid
    raise AssertionError(f"nothing listens on {host}:{port}")


@pytest.fixture(scope="module")
def topology(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Topology]:
    directory = tmp_path_factory.mktemp("discovery")
    port = free_port()
    with ExitStack() as stack:
        dns = stack.enter_context(DnsServer(directory))
        dns.set(NAME, HOSTS[:1])
        engines = [
            stack.enter_context(loopback_engine(host, port, directory / f"engine-{host}.log"))
            for host in HOSTS
        ]  # both load side by side
        for host, engine in zip(HOSTS, engines, strict=True):
            eventually(
                lambda h=host, e=engine: (
                    http_ok(f"http://{h}:{port}/health")  # type: ignore[misc]
                    or e.poll() is not None
                ),
                ENGINE_START_S,
            )
            assert engine.poll() is None, (directory / f"engine-{host}.log").read_text()[-3000:]
        gateway = start_gateway(
            "discovering", [f"dns+http://{NAME}:{port}"], directory,
            "--api-key", TEST_KEY, "--dns-nameserver", dns.nameserver,
            "--discovery-interval-s", "1", "--health-interval-s", "1",
            "--discovery-allow-local", "true",  # the engines listen on loopback addresses
            "--drain-delay", "0",  # its own SIGTERM's drain is tested elsewhere
        )  # fmt: skip
        stack.callback(gateway.terminate)
        wait_up(gateway)
        topology = Topology(dns, port, gateway)
        eventually(lambda: topology.healthy() == 1, CHANGE_S)
        yield topology


def chat(client: openai.OpenAI, messages: list[dict[str, str]], max_tokens: int = 8) -> int:
    """One chat; the completion tokens vLLM reported."""
    reply = client.chat.completions.create(
        model=MODEL,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=max_tokens,
        extra_body={"ignore_eos": True},
    )
    assert reply.usage is not None
    return reply.usage.completion_tokens


def turn(topic: str, number: int) -> list[dict[str, str]]:
    """Turn `number` of a conversation: each begins with the whole of the one before."""
    messages = [{"role": "system", "content": "You answer briefly and well. " * 6}]
    for t in range(number + 1):
        messages.append({"role": "user", "content": f"Tell me about {topic}, part {t}. " * 4})
        if t < number:
            messages.append({"role": "assistant", "content": f"Part {t} on {topic} is... " * 4})
    return messages


class Load:
    """Chats from two threads, one after another each, until stopped: what failed, if any."""

    def __init__(self, topology: Topology) -> None:
        self.done = 0
        self.tokens = 0
        """Completion tokens vLLM reported for the chats done."""
        self.failures: list[BaseException] = []
        self._counting = threading.Lock()  # two threads add to the counts
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(topology.client(), n)) for n in range(2)
        ]

    def _run(self, client: openai.OpenAI, worker: int) -> None:
        n = 0
        while not self._stop.is_set():
            try:
                tokens = chat(client, turn(f"load {worker}-{n}", 0))
                with self._counting:
                    self.tokens += tokens
                    self.done += 1
            except openai.OpenAIError as exc:
                self.failures.append(exc)
            n += 1

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(120)


def test_scale_up_under_load_spreads_requests_and_keeps_conversations(
    topology: Topology,
) -> None:
    first, second = (topology.label(host) for host in HOSTS)
    with Load(topology) as load:
        eventually(lambda: load.done >= 4, 60)
        assert set(topology.sent()) == {first}
        topology.dns.set(NAME, HOSTS)  # a second pod became ready
        eventually(lambda: topology.healthy() == 2, CHANGE_S)
        before = topology.sent().get(second, 0)
        try:
            eventually(lambda: topology.sent().get(second, 0) >= before + 3, 60)
        except AssertionError as exc:  # once on a clean clone: say what the gateway saw
            state = f"sent {topology.sent()}, healthy {topology.healthy()}, chats {load.done}"
            raise AssertionError(f"{exc}; {state}; failures {load.failures}") from None
    assert load.failures == []
    # Affinity: each conversation's later turns go where its first went.
    client = topology.client()
    for topic in ("tides", "glaciers", "comets"):
        homes = []
        for number in range(3):
            before_turn = topology.sent()
            chat(client, turn(topic, number))
            after = topology.sent()
            homes += [e for e in after if after[e] != before_turn.get(e, 0)]
        assert len(homes) == 3 and len(set(homes)) == 1, (topic, homes)


def held_stream(topology: Topology) -> tuple[SseStream, str, int, int]:
    """A long stream held mid-way, with the engine it runs on, that engine's process group
    and the completion tokens of the tries it let finish: every engine is SIGSTOPped at the
    stream's third event, then all but that one go on. On a starved machine the stream may
    be over by then: it is tried again, and the finished try is charged like any other."""
    pids = [api_server(host, topology.port) for host in HOSTS]
    groups = [os.getpgid(pid) for pid in pids]

    def freeze() -> None:
        for group in groups:
            os.killpg(group, signal.SIGSTOP)

    finished = 0
    for _ in range(3):
        stream = SseStream(
            topology.gateway.url, TEST_KEY, long_stream(400, usage=True), then=freeze
        )
        stream.start().wait_events(3)
        busy = [e for e, n in topology.series("gateway_engine_in_flight_requests").items() if n]
        if len(busy) == 1:
            held = groups[[topology.label(host) for host in HOSTS].index(busy[0])]
            thaw([group for group in groups if group != held])
            return stream, busy[0], held, finished
        thaw(groups)
        assert stream.done.wait(60) and stream.error is None
        finished += int(stream.chunks[-1]["usage"]["completion_tokens"])
    raise AssertionError("no stream was still running at its third event in 3 tries")


def thaw(groups: list[int]) -> None:
    for group in groups:
        with suppress(ProcessLookupError):
            os.killpg(group, signal.SIGCONT)


def test_scale_down_drains_a_pod_whose_stream_finishes_and_is_charged(
    topology: Topology,
) -> None:
    topology.dns.set(NAME, HOSTS)
    eventually(lambda: topology.healthy() == 2, CHANGE_S)
    charged = topology.charged()
    stream, leaving, held, finished = held_stream(topology)
    staying = next(host for host in HOSTS if topology.label(host) != leaving)
    with Load(topology) as load:
        try:
            topology.dns.set(NAME, [staying])  # the pod holding the stream is being removed
            eventually(lambda: topology.known() == 1, CHANGE_S)
            assert topology.series("gateway_engine_in_rotation")[leaving] == 0
            before = topology.sent()[leaving]
        finally:
            thaw([held])  # its stream goes on; once it is over, the engine is forgotten
        eventually(lambda: load.done >= 6, 60)
        assert topology.sent().get(leaving, before) == before  # nothing new for it
    assert load.failures == []
    assert stream.done.wait(120) and stream.failure is None and stream.error is None
    assert stream.events[-1] == "[DONE]"
    usage: dict[str, Any] = stream.chunks[-1]["usage"]
    assert usage["completion_tokens"] == 400  # the drained pod finished it
    eventually(lambda: leaving not in topology.sent(), CHANGE_S)
    # Every token was charged: the drained pod's stream, tries let finish, the load around it.
    eventually(lambda: topology.charged() == charged + finished + 400 + load.tokens, CHANGE_S)


@pytest.mark.oracle_exempt  # the killed server's counters start again from 0
def test_a_pod_killed_mid_stream_ends_that_stream_with_an_error_and_nothing_else_fails(
    topology: Topology,
) -> None:
    topology.dns.set(NAME, HOSTS)
    eventually(lambda: topology.healthy() == 2, CHANGE_S)
    charged = topology.charged()
    stream, victim, held, finished = held_stream(topology)
    host = next(host for host in HOSTS if topology.label(host) == victim)
    os.kill(api_server(host, topology.port), signal.SIGKILL)  # the pod's server crashes
    thaw([held])
    assert stream.done.wait(120)
    assert stream.error is not None, stream.events[-3:]  # an SSE error event, not a cut
    received = sum(
        1
        for chunk in stream.chunks
        if chunk["choices"] and chunk["choices"][0]["delta"].get("content")
    )
    # Requests that had not started when it died all succeed: on the other engine, or
    # failed over to it before a byte came back.
    served = sum(chat(topology.client(), turn(f"survivor {n}", 0)) for n in range(4))
    assert served == 4 * 8
    eventually(lambda: topology.series("gateway_engine_in_rotation").get(victim) == 0, CHANGE_S)
    # The cut stream was charged the tokens it delivered (one a chunk), the rest theirs.
    eventually(lambda: topology.charged() == charged + finished + received + served, CHANGE_S)
    topology.dns.set(NAME, [h for h in HOSTS if h != host])
