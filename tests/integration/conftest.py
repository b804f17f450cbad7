"""One real stack per test session: `serving up` (real vLLM on the tiny model + gateway).

Everything under tests/integration is marked `engine` (tests/services.py). The stack is
started through the real command, the way a user starts it, and stopped with SIGINT at the
end of the session, which also checks that no engine process outlives it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import httpx
import psutil
import pytest
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from serving.engine.port_check import refuse_taken
from serving.engine.process import http_ok
from tests.ports import free_port, free_port_block

if TYPE_CHECKING:  # the oracle imports this module
    from tests.integration.oracle import Ledger

REPO = Path(__file__).resolve().parents[2]
TEST_KEY = "sk-test-integration-0123456789abcdef"
MODEL = "qwen3-tiny"
# `pooling_stack`'s profiles, in its engines' order, and the models they serve.
POOLING_PROFILES = ("cpu-tiny-embedding", "cpu-tiny-reranker")
EMBEDDING_MODEL, RERANKER_MODEL = "qwen3-tiny-embedding", "qwen3-tiny-reranker"


def serving_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("SERVING_HOME", str(REPO / "var"))
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


@dataclass(frozen=True)
class Stack:
    gateway_url: str
    engine_url: str
    api_key: str
    process: subprocess.Popen[str]
    output: Path
    keys_db: Path
    """The key store the stack's gateway reads (`serving keys create --store` it)."""
    launcher_url: str
    """The launcher's own metrics (model load time, peak load memory, restarts)."""
    gateway_metrics_url: str
    """The gateway's metrics port: every series, per key too (its API port's /metrics has
    the aggregate ones only)."""
    engine_urls: tuple[str, ...] = ()
    """Every engine's URL, in the order of the profiles (`engine_url` is the first); empty:
    `engine_url` alone."""

    @property
    def engines(self) -> tuple[str, ...]:
        return self.engine_urls or (self.engine_url,)

    def client(self, **kwargs: object) -> OpenAI:
        return OpenAI(base_url=f"{self.gateway_url}/v1", api_key=self.api_key, **kwargs)  # type: ignore[arg-type]

    def direct_client(self) -> OpenAI:
        return OpenAI(base_url=f"{self.engine_url}/v1", api_key="unused")

    def oracle_urls(self) -> tuple[list[str], list[str]]:
        return [self.gateway_url], list(self.engines)

    def off_the_books(self) -> AbstractContextManager[None]:
        """Requests sent straight to the engine inside, uncharged on purpose
        (`oracle.off_the_books`)."""
        from tests.integration.oracle import off_the_books  # it imports this module

        return off_the_books(*self.oracle_urls())


def wait_for(url: str, process: subprocess.Popen[str], output: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(
                f"stack exited with {process.returncode}:\n{output.read_text()[-3000:]}"
            )
        if http_ok(url):
            return
        time.sleep(0.5)
    raise RuntimeError(f"{url} not healthy after {timeout}s:\n{output.read_text()[-3000:]}")


@contextmanager
def engine_process(
    profile: str, port: int, timeout: float = 600
) -> Iterator[subprocess.Popen[str]]:
    """`serving engine --profile P` healthy on `port`; SIGTERM at the end, no workers left."""
    process = subprocess.Popen(
        [sys.executable, "-m", "serving.cli", "engine", "--profile", profile, "--port", str(port),
         "--metrics-port", str(free_port())],
        env=serving_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + timeout
        while not http_ok(f"http://127.0.0.1:{port}/health"):
            assert process.poll() is None, process.stdout.read() if process.stdout else ""
            assert time.monotonic() < deadline, f"{profile} engine did not start"
            time.sleep(1)
        yield process
    finally:
        children = descendants(process.pid)
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=90)
        _, alive = psutil.wait_procs(children, timeout=30)
    assert code == 0
    assert not alive, f"workers left behind: {alive}"


def eventually(check: Callable[[], bool], budget_s: float = 10, poll_s: float = 0.25) -> None:
    """Poll `check` until it holds, failing after `budget_s` seconds of this process running.

    On a shared 2-core machine under full vLLM decode load, every process (this one, the
    gateway, an idle probe) is sometimes not scheduled for over 10 s (measured while writing
    this). A poll that overslept by more than a second was such a stall, which held up the
    gateway too; it is not charged to the budget, so the check measures the stack's own delay.
    """
    spent = 0.0
    while not check():
        assert spent < budget_s, f"condition not reached within {budget_s:.0f}s"
        before = time.monotonic()
        time.sleep(poll_s)
        slept = time.monotonic() - before
        spent += slept if slept < poll_s + 1.0 else poll_s


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str) -> Samples:
    """One sample of a Prometheus endpoint, by (name, labels)."""
    # generous: a gateway under a flood on a busy 2-core machine answers late, not never
    response = httpx.get(f"{url}/metrics", timeout=30)
    assert response.status_code == 200, response.text[:300]
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of every series of `name` whose labels include `labels`."""
    wanted = set(labels.items())
    return sum(value for (got, tags), value in samples.items() if got == name and wanted <= tags)


def read_tokens(stream: Iterable[Any], count: int = 3) -> int:
    """Consume a chat stream until `count` content chunks arrived (then stop reading)."""
    received = 0
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            received += 1
        if received >= count:
            break
    return received


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


@contextmanager
def serving_up(
    workdir: Path,
    *,
    profile: str | Sequence[str] | None = None,
    timeout: float = 900,
    env: dict[str, str] | None = None,
    stop: signal.Signals = signal.SIGINT,
    to_group: bool = False,
) -> Iterator[Stack]:
    """`serving up` (with `profile`, several profiles, else the default; `env` added to its
    environment, e.g. gateway settings) as a user starts it, in a session of its own as under
    a terminal or a supervisor; `stop` at the end, to its process group when `to_group` (a
    closed terminal, supervisord's stopasgroup), and then no process of the stack may be
    left, nor a port."""
    names = [profile] if isinstance(profile, str) else list(profile or ())
    port, metrics_port = free_port(), free_port()
    if len(names) > 1:  # engine i on engine_port + 2i, its launcher's metrics on the next
        engine_port = free_port_block(2 * len(names))
        launcher_port = engine_port + 1
    else:
        engine_port, launcher_port = free_port(), free_port()
    engine_ports = [engine_port + 2 * index for index in range(max(1, len(names)))]
    output, keys_db = workdir / "serving-up.out", workdir / "keys.db"
    chosen = [arg for name in names for arg in ("--profile", name)]
    with output.open("w") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "serving.cli", "up", *chosen, "--port", str(port),
             "--engine-port", str(engine_port), "--metrics-port", str(launcher_port),
             "--gateway-metrics-port", str(metrics_port), "--keys-db", str(keys_db)],
            env=serving_env(SERVING_API_KEY=TEST_KEY, **(env or {})),
            stdout=sink, stderr=subprocess.STDOUT, text=True, cwd=REPO, start_new_session=True,
        )  # fmt: skip
    stack = Stack(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{engine_port}", TEST_KEY,
                  process, output, keys_db, f"http://127.0.0.1:{launcher_port}",
                  f"http://127.0.0.1:{metrics_port}",
                  tuple(f"http://127.0.0.1:{engine}" for engine in engine_ports))  # fmt: skip
    try:
        wait_for(f"{stack.gateway_url}/healthz", process, output, timeout=timeout)
        for engine in stack.engines:
            wait_for(f"{engine}/health", process, output, timeout=60)
        yield stack
    finally:
        children = descendants(process.pid)
        if to_group:
            os.killpg(process.pid, stop)
        else:
            process.send_signal(stop)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
        _, alive = psutil.wait_procs(children, timeout=30)
        assert not alive, f"processes left behind by serving up after {stop.name}: {alive}"
        launchers = [launcher_port + 2 * index for index in range(len(engine_ports))]
        ports = (port, *engine_ports, *launchers, metrics_port)
        refuse_taken(dict.fromkeys(ports, f"after {stop.name}, a stack's"))


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # Killed at the end: its children must go with it (serving/engine/lifeline.py).
    with serving_up(tmp_path_factory.mktemp("stack"), stop=signal.SIGKILL) as running:
        yield running


@pytest.fixture(scope="session")
def pooling_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """`serving up --profile cpu-tiny-embedding --profile cpu-tiny-reranker`: the pooling
    engines (no chat engine) behind one gateway, started by the first test that needs them
    and shared by every later one (`engine_urls`: the embedding engine's, then the
    reranker's). vLLM counts their prompt tokens as it counts a chat's (its
    prompt_tokens_by_source_total), so the accounting oracle checks them too."""
    with serving_up(
        tmp_path_factory.mktemp("pooling-stack"), profile=POOLING_PROFILES, stop=signal.SIGTERM
    ) as running:
        yield running


# The fixtures the oracle checks, when their value names its gateways and engines
# (`oracle_urls`): the session's stack, the pooling engines', vision's, the tenants', the
# replicas' and discovery's topology and the multi-node cluster.
ORACLE_FIXTURES = ("stack", "pooling_stack", "vl_stack", "lora_stack", "topology", "cluster")
# The ledger the last checked test ended on, per fixture: the next test starts from it unless
# a test that reaches an engine around the gateway ran in between (one scrape of each less).
_last_ledger: dict[str, Ledger] = {}


class OracleTarget(Protocol):
    def oracle_urls(self) -> tuple[list[str], list[str]]:
        """Every gateway's API URL and every engine's: the oracle sums over them."""
        ...


CALL_FAILED = pytest.StashKey[bool]()
"""On a test's item: whether its call failed (set when its report is made, before teardown)."""


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.when == "call":
        item.stash[CALL_FAILED] = report.failed
    return report


@pytest.fixture(autouse=True)
def accounting_oracle(request: pytest.FixtureRequest) -> Iterator[None]:
    """vLLM's own counters check the accounting of every test on real engines behind
    gateways: the tokens the gateways charged meanwhile cover what the engines counted
    (`oracle`), a test's own gateways in front of them (`oracle.front`) included. Requests
    sent around the gateways go inside `off_the_books`; a test that kills or freezes what the
    oracle reads is marked `oracle_exempt`."""
    from tests.integration import oracle  # it reads this module's `scrape`

    if request.node.get_closest_marker("oracle_exempt"):
        _last_ledger.clear()
        yield
        oracle.forget_stopped()
        return
    targets: dict[str, OracleTarget] = {}
    for name in ORACLE_FIXTURES:
        if name in request.fixturenames:
            value = request.getfixturevalue(name)
            if hasattr(value, "oracle_urls"):  # not another module's fixture of that name
                targets[f"{name} {id(value)}"] = value
    if not targets:
        yield
        return
    urls = {name: target.oracle_urls() for name, target in targets.items()}

    def read(name: str, *, steady: bool) -> Ledger:
        gateways, engines = urls[name]
        return oracle.read_ledger([*gateways, *oracle.fronts_of(engines)], engines, steady=steady)

    before = {
        name: _last_ledger.pop(name) if name in _last_ledger else read(name, steady=False)
        for name in targets
    }
    yield
    if request.node.stash.get(CALL_FAILED, False):
        # The test's own failure is its report: the stack it left may never settle, and a
        # gateway of its own stopped without its last charges read (`oracle.front`).
        _last_ledger.clear()
        oracle.forget_stopped()
        return
    for name in targets:
        after = read(name, steady=True)
        _last_ledger[name] = after
        after = after.with_gateways(oracle.stopped_fronts(urls[name][1]))
        around = oracle.uncharged(urls[name][1])
        shortfall = after.shortfall(before[name]) - around
        assert shortfall <= 0, (
            f"{name}: the engines counted {shortfall:g} tokens more than the gateways charged "
            f"(slack for cut requests and {around:g} tokens sent around them included): "
            f"before {before[name]}, after {after}"
        )
