"""Pipeline parallelism and nodes in a profile: impossible splits fail with one line naming the
field, before vLLM or Ray is started."""

from __future__ import annotations

import pytest

from serving.errors import ServingError
from serving.profiles import load_profile
from serving.profiles.loader import parse_profile
from serving.profiles.model import Profile

GPU = {
    "device": "gpu",
    "gpu": "rtx-4090",
    "model": "Qwen/Qwen2.5-72B-Instruct",
    "served_model_name": "m",
    "max_model_len": 4096,
    "gpu_count": 4,
    "tensor_parallel_size": 4,
}


def parse(base: dict[str, object], **override: object) -> Profile:
    return parse_profile({**base, **override}, source="x.yaml", default_name="x")


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"pipeline_parallel_size": 0}, "pipeline_parallel_size"),
        ({"nodes": 0}, "nodes"),
        ({"pipeline_parallel_size": 2}, "nodes x gpu_count is 4"),
        ({"nodes": 2, "pipeline_parallel_size": 2}, "distributed_executor_backend: must be ray"),
        (
            {"nodes": 3, "pipeline_parallel_size": 2, "distributed_executor_backend": "ray"},
            "nodes: 3 x gpu_count 4 must equal",
        ),
    ],
)
def test_impossible_gpu_splits_name_the_field(override: dict[str, object], message: str) -> None:
    with pytest.raises(ServingError) as excinfo:
        parse(GPU, **override)
    assert message in str(excinfo.value)
    assert "\n" not in str(excinfo.value).strip()


def test_cpu_profiles_refuse_pipeline_stages_and_more_nodes_than_workers() -> None:
    cpu = {**load_profile("cpu-tiny-ray-tp2").model_dump(), "name": "x"}
    with pytest.raises(ServingError, match="pipeline_parallel_size: > 1 fails"):
        parse(cpu, pipeline_parallel_size=2)
    with pytest.raises(ServingError, match="nodes: 3 exceeds the 2 workers"):
        parse(cpu, nodes=3)


def test_the_two_node_profiles_hold_one_replica_across_their_nodes() -> None:
    gpu = load_profile("qwen2.5-72b-pp2-tp4-2x4090x4")
    assert (gpu.nodes, gpu.gpu_count) == (2, 4)
    assert gpu.tensor_parallel_size * gpu.pipeline_parallel_size == gpu.nodes * gpu.gpu_count
    assert gpu.distributed_executor_backend == "ray"
    cpu = load_profile("cpu-tiny-ray-tp2")
    assert (cpu.nodes, cpu.tensor_parallel_size, cpu.distributed_executor_backend) == (2, 2, "ray")
