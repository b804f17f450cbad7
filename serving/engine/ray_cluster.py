"""A Ray node as a child process: the cluster's head beside vLLM, or a node that joins one
(docs/multi-node.md).

    node = RayNode(port=6379)                   # head; RayNode(address="10.0.0.5:6379") joins
    head = RayNodeProcess(node, log_path=...)
    head.start(); head.wait_ready(60)
    ...
    head.stop()

Rules:
- the node runs `ray start --block` in its own process group: Ray's daemons ignore SIGTERM,
  so what is left after the grace period is killed by group;
- never `ray stop`: it ends every Ray process of the machine by name, other users' included;
- `port_block` moves every port a node listens on into one range of PORT_BLOCK_SIZE ports
  (tests run several clusters on one machine).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from serving.engine.lifeline import with_lifeline
from serving.engine.process import signal_group
from serving.errors import ServingError

DEFAULT_PORT = 6379
READY_LINE = "Ray runtime started."
PORT_BLOCK_SIZE = 64
WORKER_PORTS_FROM = 16  # worker processes listen on block+16 .. block+63


@dataclass(frozen=True, kw_only=True)
class RayNode:
    """One `ray start`: the head (`address` None) or a node joining the head at `address`."""

    address: str | None = None
    port: int = DEFAULT_PORT  # the head's GCS port
    node_ip: str | None = None  # None: Ray's guess (the pod IP in Kubernetes)
    num_cpus: int | None = None  # None: Ray counts them
    num_gpus: int | None = None
    temp_dir: Path | None = None  # None: Ray's /tmp/ray
    port_block: int | None = None  # first of PORT_BLOCK_SIZE ports for every other server
    object_store_bytes: int | None = None

    @property
    def is_head(self) -> bool:
        return self.address is None

    def cluster_address(self) -> str:
        """What RAY_ADDRESS (and a joining node's --address) says for this node's cluster."""
        if self.address is not None:
            return self.address
        return f"{self.node_ip or '127.0.0.1'}:{self.port}"


def _port_args(block: int, head: bool) -> list[str]:
    names = [
        "--node-manager-port",
        "--object-manager-port",
        "--metrics-export-port",
        "--runtime-env-agent-port",
        "--dashboard-agent-listen-port",
        "--dashboard-agent-grpc-port",
    ]
    if head:
        names.append("--ray-client-server-port")
    args = [arg for offset, name in enumerate(names) for arg in (name, str(block + offset))]
    first_worker = block + WORKER_PORTS_FROM
    last_worker = block + PORT_BLOCK_SIZE - 1
    return [*args, "--min-worker-port", str(first_worker), "--max-worker-port", str(last_worker)]


def ray_start_argv(node: RayNode, *, python: str = sys.executable) -> list[str]:
    """`ray start --block ...` for `node`, run with `python`'s Ray (default: this one's)."""
    argv = [python, "-m", "ray.scripts.scripts", "start", "--block"]
    argv.append("--disable-usage-stats")
    if node.is_head:
        # The dashboard is a web UI with job submission: not part of serving.
        argv += ["--head", "--port", str(node.port), "--include-dashboard", "false"]
    else:
        argv += ["--address", node.cluster_address()]
    for flag, value in (
        ("--node-ip-address", node.node_ip),
        ("--num-cpus", node.num_cpus),
        ("--num-gpus", node.num_gpus),
        ("--temp-dir", node.temp_dir),
        ("--object-store-memory", node.object_store_bytes),
    ):
        if value is not None:
            argv += [flag, str(value)]
    if node.port_block is not None:
        argv += _port_args(node.port_block, node.is_head)
    return argv


def ray_env() -> dict[str, str]:
    """Variables every Ray process of ours runs with.

    Usage reporting would reach out. Draining on SIGTERM (Ray 2.60 waits up to 30 s for the
    node's work to move away, for Ray Serve's proxies) has nothing to wait for here: a node
    of ours is stopped after vLLM has exited, and a worker node whose head is gone waited
    out the whole timeout (the multi-node test's teardown spent 60 s in two such waits).
    """
    return {"RAY_USAGE_STATS_ENABLED": "0", "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}


@dataclass
class RayNodeProcess:
    """A started `ray start --block`; `stop()` leaves none of its processes behind."""

    node: RayNode
    log_path: Path
    popen: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = None
    _offset: int = 0

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        self._offset = self._log.tell()
        self.popen = subprocess.Popen(
            with_lifeline(ray_start_argv(self.node)),
            env={**os.environ, **ray_env()},
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int | None:
        return None if self.popen is None else self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def _logged_ready(self) -> bool:
        with self.log_path.open("rb") as handle:
            handle.seek(self._offset)
            return READY_LINE.encode() in handle.read()

    def wait_ready(self, timeout: float) -> float:
        """Block until `ray start` reports its node running; returns the seconds it took."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if self.popen is None or self.popen.poll() is not None:
                code = None if self.popen is None else self.popen.returncode
                raise ServingError(f"ray start exited with code {code}; log {self.log_path}")
            if self._logged_ready():
                return time.monotonic() - started
            time.sleep(0.5)
        raise ServingError(f"Ray node not started within {timeout:.0f}s; log {self.log_path}")

    def ensure_running(self, timeout: float) -> None:
        """Start the node again if it died (a vLLM restart needs its cluster back first)."""
        if self.alive():
            return
        self.stop()
        self.start()
        self.wait_ready(timeout)

    def stop(self, grace: float = 30.0) -> None:
        """SIGTERM `ray start` (it drains and ends its node), SIGKILL the group's leftovers."""
        if self.popen is not None:
            group = self.popen.pid
            signal_group(group, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=grace)
            # gcs_server and raylet ignore SIGTERM: what `ray start` did not end is killed.
            signal_group(group, signal.SIGKILL)
            self.popen.wait(timeout=10)
            self.popen = None
        if self._log is not None:
            self._log.close()
            self._log = None
