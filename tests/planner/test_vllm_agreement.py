"""The planner's block arithmetic against vLLM's own functions, where vLLM is installed.

Given the same KV space, vLLM's `get_kv_cache_groups`, `get_kv_cache_config_from_groups` and
`get_max_concurrency_for_kv_cache_config` (vllm/v1/core/kv_cache_utils.py) must produce the
planner's block count, concurrency and logged token capacity. vLLM is imported
through importlib so the planner's type checking does not walk vLLM.
"""

from __future__ import annotations

import importlib
from types import SimpleNamespace
from typing import Any

import pytest

from serving.planner import PlanSettings, evaluate, get_gpu, resolve_model

torch: Any = importlib.import_module("torch")
interface: Any = importlib.import_module("vllm.v1.kv_cache_interface")
utils: Any = importlib.import_module("vllm.v1.core.kv_cache_utils")
layouts: Any = importlib.import_module("vllm.v1.kv_cache_layout")


def _vllm_config(max_model_len: int, mamba_cache_mode: str) -> Any:
    layout = layouts.KVCacheLayout.LBHNC
    return SimpleNamespace(
        model_config=SimpleNamespace(max_model_len=max_model_len),
        parallel_config=SimpleNamespace(
            decode_context_parallel_size=1, prefill_context_parallel_size=1
        ),
        cache_config=SimpleNamespace(
            mamba_cache_mode=mamba_cache_mode,
            num_gpu_blocks_override=None,
            prefix_cache_retention_interval=None,
            get_resolved_kv_cache_layout=lambda: layout,
        ),
        attention_config=SimpleNamespace(hisparse_config=None),
        scheduler_config=SimpleNamespace(disable_hybrid_kv_cache_manager=False),
        speculative_config=None,
    )


CASES = [
    ("Qwen2.5-7B-Instruct", "rtx-4090", PlanSettings(max_model_len=32768)),
    ("Qwen2.5-7B-Instruct", "rtx-4090", PlanSettings(max_model_len=30000, tensor_parallel_size=4)),
    ("Qwen3-8B", "cpu", PlanSettings(max_model_len=8192, kv_space_gib=1)),
    ("Qwen3.5-9B", "rtx-4090", PlanSettings(max_model_len=131072, tensor_parallel_size=4)),
    (
        "Qwen3.5-9B",
        "rtx-4090",
        PlanSettings(max_model_len=100000, tensor_parallel_size=4, kv_cache_dtype="fp8"),
    ),
    (
        "Qwen3.5-27B",
        "h100",
        PlanSettings(max_model_len=65536, quantization="awq", prefix_caching=False),
    ),
    ("Qwen3-Coder-30B-A3B-Instruct", "h100", PlanSettings(max_model_len=131072)),
]


@pytest.mark.parametrize(("model", "gpu", "settings"), CASES)
def test_capacity_matches_vllm(model: str, gpu: str, settings: PlanSettings) -> None:
    spec = resolve_model(model)
    plan = evaluate(spec, get_gpu(gpu), settings)
    s, layout = plan.settings, plan.layout
    tp = s.tensor_parallel_size
    kv_dtype = torch.float8_e4m3fn if s.kv_cache_dtype.startswith("fp8") else torch.bfloat16
    mode = "align" if s.prefix_caching and spec.is_hybrid else "none"
    specs: dict[str, Any] = {}
    for index in range(spec.layers):
        if not spec.layer_types or spec.layer_types[index] == "full_attention":
            specs[f"{index}.attn"] = interface.FullAttentionSpec(
                block_size=layout.block_size,
                num_kv_heads=max(1, spec.kv_heads // tp),
                head_size=spec.head_dim,
                dtype=kv_dtype,
            )
            continue
        assert spec.linear is not None
        g = spec.linear
        shapes = ((g.conv_dim // tp, g.conv_kernel - 1), (g.value_heads // tp, 128, 128))
        state = interface.MambaSpec(
            block_size=layout.block_size, shapes=shapes, dtypes=(torch.bfloat16, torch.float32)
        )
        assert state.page_size_bytes == layout.state_bytes_per_layer
        specs[f"{index}.gdn"] = interface.MambaSpec(
            block_size=layout.block_size,
            shapes=shapes,
            dtypes=(torch.bfloat16, torch.float32),
            page_size_padded=layout.page_bytes,
            mamba_cache_mode=mode,
        )
    config = _vllm_config(s.max_model_len or 0, mode)
    groups = utils.get_kv_cache_groups(config, specs)
    kv_config = utils.get_kv_cache_config_from_groups(config, groups, plan.kv_available_bytes)
    concurrency = utils.get_max_concurrency_for_kv_cache_config(config, kv_config)
    assert len(groups) == layout.attention_groups + layout.state_groups
    assert kv_config.num_blocks == plan.capacity.num_blocks
    assert concurrency == plan.capacity.max_concurrency
    assert int(concurrency * (s.max_model_len or 0)) == plan.capacity.tokens
