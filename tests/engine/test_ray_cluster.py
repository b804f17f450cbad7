"""The Ray node the launcher runs: its `ray start` command line, a real head started and
stopped with nothing left behind, and `serving engine`'s checks before any of it starts."""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

import psutil
import pytest

from serving.engine.command import add_arguments, ray_head
from serving.engine.ray_cluster import (
    PORT_BLOCK_SIZE,
    RayNode,
    RayNodeProcess,
    ray_start_argv,
)
from serving.errors import ServingError
from serving.profiles import load_profile
from tests.ports import free_port, free_port_block


def options(argv: list[str]) -> list[str]:
    """The flags of a `ray start` line (after `python -m ray.scripts.scripts start`)."""
    return argv[4:]


def test_a_head_blocks_and_puts_every_port_in_its_block() -> None:
    argv = ray_start_argv(RayNode(port=7000, port_block=7100, num_cpus=1, node_ip="10.0.0.5"))
    flags = options(argv)
    assert flags[:2] == ["--block", "--disable-usage-stats"]
    assert flags[flags.index("--port") + 1] == "7000" and "--head" in flags
    assert flags[flags.index("--include-dashboard") + 1] == "false"
    ports = [int(flags[i + 1]) for i, flag in enumerate(flags) if flag.endswith("-port")]
    ports.remove(7000)
    assert all(7100 <= port < 7100 + PORT_BLOCK_SIZE for port in ports), ports
    assert len(ports) == len(set(ports))
    assert RayNode(port=7000, node_ip="10.0.0.5").cluster_address() == "10.0.0.5:7000"


def test_a_joining_node_names_the_head_and_opens_no_client_server() -> None:
    node = RayNode(address="10.0.0.5:7000", port_block=7100)
    flags = options(ray_start_argv(node))
    assert flags[flags.index("--address") + 1] == "10.0.0.5:7000"
    assert "--head" not in flags and "--ray-client-server-port" not in flags
    assert node.cluster_address() == "10.0.0.5:7000"


def test_a_head_starts_and_stops_without_leaving_a_process(tmp_path: Path) -> None:
    temp = Path(tempfile.mkdtemp(prefix="rayt-", dir="/tmp"))  # short: Ray's unix sockets
    node = RayNode(
        port=free_port(), node_ip="127.0.0.1", num_cpus=1, temp_dir=temp,
        port_block=free_port_block(), object_store_bytes=80 << 20,
    )  # fmt: skip
    head = RayNodeProcess(node, log_path=tmp_path / "ray.log")
    seen: list[psutil.Process] = []
    try:
        head.start()
        assert head.wait_ready(120) > 0
        assert head.pid is not None
        seen = [psutil.Process(head.pid), *psutil.Process(head.pid).children(recursive=True)]
        names = {process.name() for process in seen}
        assert {"gcs_server", "raylet"} <= names, names
    finally:
        head.stop()
        _, alive = psutil.wait_procs(seen, timeout=30)
        for process in alive:
            process.kill()
        shutil.rmtree(temp, ignore_errors=True)
    assert not alive, alive
    assert not head.alive()


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_ray_head_is_only_for_ray_profiles() -> None:
    with pytest.raises(ServingError, match="--ray-head: profile cpu-tiny-tp2 does not run on"):
        ray_head(parse("--ray-head"), load_profile("cpu-tiny-tp2"))
    assert ray_head(parse(), load_profile("cpu-tiny-tp2")) is None


def test_a_profile_across_nodes_needs_a_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    profile = load_profile("cpu-tiny-ray-tp2")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(ServingError, match="spans 2 nodes: start the Ray head here"):
        ray_head(parse(), profile)
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")
    assert ray_head(parse(), profile) is None  # vLLM joins that cluster
    head = ray_head(parse("--ray-head", "--ray-port", "7000", "--ray-num-cpus", "1"), profile)
    assert head is not None and head.node.is_head and head.node.num_cpus == 1
    assert head.node.cluster_address() == "127.0.0.1:7000"
