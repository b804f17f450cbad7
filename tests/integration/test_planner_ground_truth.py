"""The planner's numbers for the tiny model equal what vLLM and the files say."""

from __future__ import annotations

from serving.models.tiny_model import ensure_tiny_model
from serving.planner import get_gpu, plan_for, resolve_model
from serving.planner.profile_plan import profile_settings
from serving.profiles import load_profile
from tests.integration.conftest import Stack
from tests.integration.planner_truth import planned_capacity, vllm_cache_info
from tests.safetensors_bytes import model_tensor_bytes


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
    on_disk = model_tensor_bytes(model_dir)
    assert plan.weights.total == on_disk
