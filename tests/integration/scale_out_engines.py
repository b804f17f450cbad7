"""The engines of the scale-out tests: `serving up --replicas N` started, awaited and stopped
the way an operator does it, and its vLLM servers frozen (SIGSTOP), thawed and killed
(`EngineControl`), found by the ports they listen on (re-exported by `scale_out`)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from tests.integration.conftest import (
    REPO,
    TEST_KEY,
    Stack,
    descendants,
    serving_env,
    wait_for,
)
from tests.ports import free_port

if TYPE_CHECKING:
    from tests.integration.scale_out import Gateway

# Only bounds how long a broken start hangs; never waited out when things work.
ENGINES_START_S = 900.0


def port_block(count: int) -> int:
    """The first of `count` consecutive free loopback ports (`serving up` uses engine port
    + 2i for engine i and the port after each for its launcher's metrics)."""
    for _ in range(500):
        base = free_port()
        if base + count <= 65535 and all(_is_free(base + step) for step in range(1, count)):
            return base
    raise RuntimeError(f"no {count} consecutive free ports found")


def _is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@dataclass(frozen=True)
class ServingUp:
    """`serving up --replicas N`: its `Stack` (engine 0 as `engine_url`) and every engine."""

    stack: Stack
    engine_ports: tuple[int, ...]
    launcher_ports: tuple[int, ...]

    @property
    def engine_urls(self) -> list[str]:
        return [f"http://127.0.0.1:{port}" for port in self.engine_ports]

    @property
    def gateway(self) -> Gateway:
        from tests.integration.scale_out import Gateway

        stack = self.stack
        return Gateway(
            "serving-up", stack.gateway_url, stack.process, stack.output, self.engine_urls,
            stack.gateway_metrics_url,
        )  # fmt: skip


def start_serving_up(directory: Path, keys_db: Path, *, replicas: int, routing: str) -> ServingUp:
    """`serving up --replicas N --routing R` as a user runs it (returns at once: the engines
    load side by side; see `wait_serving_up`)."""
    port, engine_port, metrics_port = free_port(), port_block(2 * replicas), free_port()
    output = directory / "serving-up.out"
    with output.open("w") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "serving.cli", "up", "--replicas", str(replicas),
             "--routing", routing, "--port", str(port), "--engine-port", str(engine_port),
             "--gateway-metrics-port", str(metrics_port), "--keys-db", str(keys_db)],
            env=serving_env(SERVING_API_KEY=TEST_KEY), cwd=REPO,
            stdout=sink, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
    engine_ports = tuple(engine_port + 2 * replica for replica in range(replicas))
    stack = Stack(
        f"http://127.0.0.1:{port}",
        f"http://127.0.0.1:{engine_port}",
        TEST_KEY,
        process,
        output,
        keys_db,
        f"http://127.0.0.1:{engine_port + 1}",
        f"http://127.0.0.1:{metrics_port}",
    )
    return ServingUp(stack, engine_ports, tuple(port + 1 for port in engine_ports))


def wait_serving_up(up: ServingUp) -> None:
    stack = up.stack
    wait_for(f"{stack.gateway_url}/healthz", stack.process, stack.output, ENGINES_START_S)


def stop_serving_up(up: ServingUp) -> tuple[int, list[psutil.Process]]:
    """SIGTERM (a supervisor's stop) to `serving up` alone; its exit code and any process it
    left behind."""
    process = up.stack.process
    children = descendants(process.pid)
    process.send_signal(signal.SIGTERM)
    try:
        code = process.wait(timeout=120)
    except subprocess.TimeoutExpired:
        process.kill()
        raise
    _, alive = psutil.wait_procs(children, timeout=30)
    return code, alive


# -- the engines ------------------------------------------------------------------------


def listening_pid(port: int) -> int:
    """The process listening on loopback `port` (a vLLM API server: its engine core and
    workers are its children, in its process group)."""
    for connection in psutil.net_connections("tcp"):
        if (
            connection.status == psutil.CONN_LISTEN
            and connection.laddr
            and connection.laddr.port == port
            and connection.pid is not None
        ):
            return connection.pid
    raise AssertionError(f"nothing listens on port {port}")


class EngineControl:
    """Signals to the vLLM servers on `ports` (index i: the server on ports[i]).

    `freeze` (SIGSTOP to the server's process group) holds its requests where they are, as
    an engine busy for that long would, while the kernel still accepts connections for it;
    `thaw` (SIGCONT) lets them go on; `kill` SIGKILLs the API server alone, as a crash would.
    The processes are looked up when the control is made, so that each signal is one system
    call: on two cores the tiny model makes 1,800 tokens in one second or ten, and a test
    acting on a stream's first tokens has no time to spare. Leaving the block thaws whatever
    it froze.
    """

    def __init__(self, ports: tuple[int, ...]) -> None:
        self.pids = [listening_pid(port) for port in ports]
        self.groups = [os.getpgid(pid) for pid in self.pids]
        self._frozen: set[int] = set()

    def __enter__(self) -> EngineControl:
        return self

    def __exit__(self, *exc: object) -> None:
        self.thaw(*self._frozen)

    def freeze(self, *indexes: int) -> None:
        for index in indexes or range(len(self.groups)):
            os.killpg(self.groups[index], signal.SIGSTOP)
            self._frozen.add(index)

    def thaw(self, *indexes: int) -> None:
        for index in list(indexes or range(len(self.groups))):
            with contextlib.suppress(ProcessLookupError):  # the whole group died
                os.killpg(self.groups[index], signal.SIGCONT)
            self._frozen.discard(index)

    def kill(self, index: int) -> None:
        os.kill(self.pids[index], signal.SIGKILL)

    @property
    def frozen(self) -> set[int]:
        return set(self._frozen)


# -- Redis ------------------------------------------------------------------------------
