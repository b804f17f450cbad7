"""Planner vs vLLM for the fp8 KV caches of the CPU build.

vLLM's CPU attention lists `auto`, `fp8`, `fp8_e4m3` and `fp8_e5m2`, but its fp8 kernels need
AVX-512 or AMX. `auto` is checked on the shared stack (test_planner_ground_truth.py); here one
fp8 engine starts through the real launcher: on a CPU with AVX-512 its capacity must equal the
planner's, on an AVX2-only CPU (like the development machines) vLLM must refuse it.
"""

from __future__ import annotations

import pytest

from serving.engine.launch import build_supervisor
from serving.engine.supervisor import RestartPolicy
from serving.errors import ServingError
from serving.models.tiny_model import ensure_tiny_model
from serving.planner import get_gpu, plan_for, resolve_model
from serving.planner.host_cpu import fp8_kv_supported
from serving.planner.profile_plan import profile_settings
from serving.profiles import load_profile
from tests.integration.planner_truth import vllm_cache_info
from tests.ports import free_port


def test_fp8_kv_cache_capacity_matches_vllm_or_is_refused_without_avx512() -> None:
    profile = load_profile("cpu-tiny").model_copy(update={"kv_cache_dtype": "fp8"})
    plan = plan_for(
        resolve_model(str(ensure_tiny_model())), get_gpu("cpu"), profile_settings(profile)
    )
    # One byte per element: twice the tokens of the bf16 cache in the same space.
    assert plan.capacity.tokens == 2 * 524288
    port = free_port()
    supervisor = build_supervisor(
        profile, host="127.0.0.1", port=port, policy=RestartPolicy(start_timeout_s=600)
    )
    if not fp8_kv_supported():
        with pytest.raises(ServingError, match="AVX-512"):
            supervisor.start()
        supervisor.stop()
        return
    supervisor.start()
    try:
        info = vllm_cache_info(f"http://127.0.0.1:{port}")
    finally:
        supervisor.stop()
    assert info["cache_dtype"] == "fp8"
    assert int(info["num_gpu_blocks"]) == plan.capacity.num_blocks
    assert int(info["kv_cache_size_tokens"]) == plan.capacity.tokens
