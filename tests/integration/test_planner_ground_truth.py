"""The planner's numbers for the tiny model equal what vLLM and the files say."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from serving.models.tiny_model import ensure_tiny_model
from serving.planner import get_gpu, plan_for, resolve_model
from serving.planner.command import profile_settings
from serving.profiles import load_profile
from tests.integration.conftest import Stack
from tests.integration.planner_truth import planned_capacity, vllm_cache_info

DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "I32": 4, "I8": 1, "U8": 1}


def tensor_bytes(path: Path) -> int:
    """Sum of every tensor's bytes per the safetensors header (the file minus its header)."""
    with path.open("rb") as handle:
        (header_len,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(header_len))
    total = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        assert end - start == DTYPE_BYTES[info["dtype"]] * _count(info["shape"])
        total += end - start
    assert total == path.stat().st_size - 8 - header_len
    return total


def _count(shape: list[int]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def test_kv_capacity_equals_what_vllm_reports_at_tp1(stack: Stack) -> None:
    info = vllm_cache_info(stack.engine_url)
    planned = planned_capacity("cpu-tiny", str(ensure_tiny_model()))
    assert int(info["num_gpu_blocks"]) == planned.num_blocks
    assert int(info["kv_cache_size_tokens"]) == planned.tokens
    assert float(info["kv_cache_max_concurrency"]) == planned.max_concurrency


def test_weight_bytes_equal_the_safetensors_files(stack: Stack) -> None:
    model_dir = ensure_tiny_model()
    plan = plan_for(
        resolve_model(str(model_dir)), get_gpu("cpu"), profile_settings(load_profile("cpu-tiny"))
    )
    on_disk = sum(tensor_bytes(path) for path in model_dir.glob("*.safetensors"))
    assert plan.weights.total == on_disk
