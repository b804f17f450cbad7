"""One model across two machines: vLLM's Ray executor serves the tiny model with TP=2 over a
two-node Ray cluster on this host, through `serving engine` and the gateway.

The head node is started by the launcher (`serving engine --profile cpu-tiny-ray-tp2
--ray-head`); the second node joins it the way another machine would (`ray start --address`).
Each node offers Ray one CPU, so vLLM's placement group (one CPU per worker) puts one worker on
each node. The cluster is the test's own: its ports (a block per node), its temp dirs, its
auth token (RAY_AUTH_MODE=token: nodes of other clusters on this machine cannot join it). Ray's
gcs_server and raylet ignore SIGTERM, so every process the test saw is tracked by PID and
must be gone at the end; nothing here runs `ray stop`, which ends Ray processes by name.
"""

from __future__ import annotations

import contextlib
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import openai
import psutil
import pytest
from openai import OpenAI

from serving.engine.process import http_ok
from serving.engine.ray_cluster import RayNode, RayNodeProcess
from tests.integration.conftest import MODEL, REPO, TEST_KEY, descendants, serving_env
from tests.ports import free_port, free_port_block

PROFILE = "cpu-tiny-ray-tp2"
WORKER_TITLE = "ray::CpuRayWorkerProc"  # Ray titles an actor's process after its class
START_TIMEOUT_S = 600


def wait_until(
    check: Callable[[], bool], what: str, timeout: float, alive: subprocess.Popen[str]
) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert alive.poll() is None, f"serving engine exited with {alive.returncode} ({what})"
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f}s"
        time.sleep(1)


@dataclass
class Cluster:
    engine: subprocess.Popen[str]  # `serving engine --ray-head`: the head node and vLLM
    node: RayNodeProcess  # the second node
    engine_url: str
    gateway_url: str
    engine_log: Path
    launcher_out: Path  # what `serving engine` printed (its restarts)
    seen: dict[int, psutil.Process] = field(default_factory=dict)

    def oracle_urls(self) -> tuple[list[str], list[str]]:
        return [self.gateway_url], [self.engine_url]

    def track(self) -> None:
        """Remember every process now running under the launcher or the second node."""
        roots = [self.engine.pid, self.node.pid]
        for root in (pid for pid in roots if pid is not None):
            with contextlib.suppress(psutil.NoSuchProcess):
                self.seen.setdefault(root, psutil.Process(root))
            for process in descendants(root):
                self.seen.setdefault(process.pid, process)

    def workers(self) -> tuple[list[psutil.Process], list[psutil.Process]]:
        """vLLM's Ray workers under the head node and under the second node."""
        assert self.node.pid is not None
        return _workers(self.engine.pid), _workers(self.node.pid)


def _workers(root: int) -> list[psutil.Process]:
    found = []
    for process in descendants(root):
        try:
            if process.name().startswith(WORKER_TITLE):
                found.append(process)
        except psutil.NoSuchProcess:
            continue
    return found


def _stop(cluster: Cluster) -> None:
    cluster.track()
    cluster.engine.send_signal(signal.SIGTERM)  # vLLM first (it ends its workers), then Ray
    try:
        cluster.engine.wait(timeout=120)
    finally:
        cluster.node.stop()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    token = secrets.token_hex(16)
    ray_auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    # Short paths: Ray puts unix sockets under its temp dir (at most 107 bytes a path).
    head_tmp = Path(tempfile.mkdtemp(prefix="rayh-", dir="/tmp"))
    node_tmp = Path(tempfile.mkdtemp(prefix="rayw-", dir="/tmp"))
    ray_port, engine_port, gateway_port = free_port(), free_port(), free_port()
    engine_log, launcher_out = tmp_path / "engine.log", tmp_path / "launcher.out"
    with launcher_out.open("w") as sink:
        engine = subprocess.Popen(
            [sys.executable, "-m", "serving.cli", "engine", "--profile", PROFILE,
             "--port", str(engine_port), "--metrics-port", "0", "--log-file", str(engine_log),
             "--ray-head", "--ray-port", str(ray_port), "--ray-node-ip", "127.0.0.1",
             "--ray-num-cpus", "1", "--ray-temp-dir", str(head_tmp),
             "--ray-port-block", str(free_port_block())],
            env=serving_env(**ray_auth), cwd=REPO, stdout=sink,
            stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )  # fmt: skip
    node = RayNodeProcess(
        RayNode(
            address=f"127.0.0.1:{ray_port}",
            node_ip="127.0.0.1",
            num_cpus=1,
            temp_dir=node_tmp,
            port_block=free_port_block(),
        ),
        log_path=tmp_path / "ray-node.log",
    )
    gateway: subprocess.Popen[str] | None = None
    cluster = Cluster(
        engine, node, f"http://127.0.0.1:{engine_port}", f"http://127.0.0.1:{gateway_port}",
        engine_log, launcher_out,
    )  # fmt: skip
    try:
        with socket.socket() as probe:  # the head's GCS answers: the second node can join
            wait_until(
                lambda: probe.connect_ex(("127.0.0.1", ray_port)) == 0, "Ray head", 120, engine
            )
        with pytest.MonkeyPatch.context() as env:
            for key, value in ray_auth.items():
                env.setenv(key, value)
            node.start()
        node.wait_ready(120)
        wait_until(lambda: http_ok(f"{cluster.engine_url}/health"), "vLLM", START_TIMEOUT_S, engine)
        gateway = subprocess.Popen(
            [sys.executable, "-m", "serving.cli", "gateway", "--upstream", cluster.engine_url,
             "--port", str(gateway_port), "--keys-db", str(tmp_path / "keys.db"),
             "--drain-delay", "0"],  # its own SIGTERM's drain is tested elsewhere
            env=serving_env(SERVING_API_KEY=TEST_KEY), cwd=REPO,
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        wait_until(lambda: http_ok(f"{cluster.gateway_url}/healthz"), "gateway", 60, engine)
        cluster.track()
        yield cluster
    finally:
        if gateway is not None:
            gateway.terminate()
            gateway.wait(timeout=30)
        try:
            _stop(cluster)
        finally:
            _, alive = psutil.wait_procs(list(cluster.seen.values()), timeout=30)
            for process in alive:  # fail below, but leave nothing running on a shared machine
                process.kill()
            shutil.rmtree(head_tmp, ignore_errors=True)
            shutil.rmtree(node_tmp, ignore_errors=True)
        assert engine.returncode == 0, launcher_out.read_text()[-3000:]
        assert not alive, f"left behind: {alive}"


def chat(gateway_url: str) -> int:
    client = OpenAI(base_url=f"{gateway_url}/v1", api_key=TEST_KEY, timeout=120)
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello there."}],
        max_tokens=8, temperature=0, extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert reply.choices[0].message.content
    assert reply.usage is not None
    return reply.usage.completion_tokens


def test_tp2_across_two_ray_nodes_answers_through_the_gateway(cluster: Cluster) -> None:
    on_head, on_node = cluster.workers()
    assert len(on_head) == 1 and len(on_node) == 1, (on_head, on_node)
    # Each worker is a child of its own node's raylet: two nodes, one rank each.
    raylets = [psutil.Process(worker.ppid()) for worker in (*on_head, *on_node)]
    assert [raylet.name() for raylet in raylets] == ["raylet", "raylet"]
    assert raylets[0].pid != raylets[1].pid
    assert chat(cluster.gateway_url) == 8

    # A worker on the other node dies: vLLM exits, the launcher restarts it on the cluster.
    dead = on_node[0]
    dead.kill()
    dead.wait(timeout=30)

    def restarted() -> bool:
        head, node = cluster.workers()
        fresh = len(node) == 1 and node[0].pid != dead.pid and len(head) == 1
        return fresh and http_ok(f"{cluster.engine_url}/health")

    wait_until(restarted, "vLLM back after its remote worker died", START_TIMEOUT_S, cluster.engine)
    cluster.track()
    assert "restarting" in cluster.launcher_out.read_text()
    # The gateway checks its upstream's health every few seconds: until it has seen the
    # restarted engine healthy it answers 503 (no model server), which is its contract.
    deadline = time.monotonic() + 120
    while True:
        try:
            assert chat(cluster.gateway_url) == 8
            break
        except openai.InternalServerError as exc:
            assert exc.status_code == 503 and time.monotonic() < deadline, exc
            time.sleep(1)
