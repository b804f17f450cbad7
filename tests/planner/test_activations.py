"""The activation estimate's MoE term, held against the buffers vLLM's fused-MoE kernel asks for.

vLLM's Triton experts (`TritonExperts.workspace_shapes`, the kernel for unquantized MoE on
GPUs) allocate workspace13, which the output shares, and workspace2 for every batched token;
the planner counts those, the router logits and the four hidden-size tensors it counts for any
layer. vLLM is imported through importlib so the planner's type checking does not walk vLLM.
"""

from __future__ import annotations

import importlib
import math
from typing import Any

import pytest

from serving.planner import resolve_model
from serving.planner.activations import activation_estimate

triton_moe: Any = importlib.import_module("vllm.model_executor.layers.fused_moe.experts.triton_moe")
activation: Any = importlib.import_module("vllm.model_executor.layers.fused_moe.activation")

CODER = resolve_model("Qwen3-Coder-30B-A3B-Instruct")


@pytest.mark.parametrize(("tp", "tokens"), [(1, 8192), (4, 2048), (8, 16384)])
def test_moe_forward_peak_is_the_fused_moe_workspaces(tp: int, tokens: int) -> None:
    moe = CODER.moe
    assert moe is not None
    experts = triton_moe.TritonExperts
    workspace13, workspace2, output = experts.workspace_shapes(
        experts,
        tokens,
        2 * moe.expert_intermediate // tp,  # N: w13's rows on one GPU (gate and up)
        CODER.hidden,
        moe.experts_per_token,
        moe.num_experts,
        moe.num_experts,
        None,
        activation.MoEActivation.SILU,
    )
    values = max(math.prod(workspace13), math.prod(output)) + math.prod(workspace2)
    values += tokens * (4 * CODER.hidden + moe.num_experts)  # hidden tensors + router logits
    estimate = activation_estimate(
        CODER, tp, dtype_bytes=2, max_num_batched_tokens=tokens, max_num_seqs=1
    )
    assert estimate.forward_bytes == 2 * values


def test_a_dense_mlp_counts_its_gate_up_output_and_activation() -> None:
    spec = resolve_model("Qwen2.5-7B-Instruct")
    estimate = activation_estimate(
        spec, 1, dtype_bytes=2, max_num_batched_tokens=2048, max_num_seqs=256
    )
    assert estimate.forward_bytes == 2048 * 2 * (4 * 3584 + 3 * 18944)
