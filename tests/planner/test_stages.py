"""Pipeline stages: vLLM's layer split, per-stage memory, nodes, and what the planner suggests
when a model needs more than one machine."""

from __future__ import annotations

from dataclasses import replace

import pytest

from serving.planner import PlanSettings, evaluate, get_gpu, plan_for, resolve_model
from serving.planner.stages import pp_partition, pp_ranges, stage_spec
from serving.planner.weights import weight_bytes

RTX4090 = get_gpu("rtx-4090")
QWEN72B = resolve_model("Qwen2.5-72B-Instruct")


@pytest.mark.parametrize("layers", [1, 2, 7, 24, 28, 30, 36, 48, 64, 80])
@pytest.mark.parametrize("pp", [1, 2, 3, 4, 5, 8])
def test_stages_hold_the_layers_vllm_gives_them(
    layers: int, pp: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    if pp > layers:
        return
    monkeypatch.delenv("VLLM_PP_LAYER_PARTITION", raising=False)
    from vllm.distributed.utils import get_pp_indices

    expected = tuple(get_pp_indices(layers, rank, pp) for rank in range(pp))
    assert pp_ranges(layers, pp) == expected
    assert sum(pp_partition(layers, pp)) == layers


def test_stages_together_hold_the_whole_model_once() -> None:
    whole = weight_bytes(QWEN72B, 4, dtype_bytes=2, awq_group_size=None).total
    plan = evaluate(
        QWEN72B, RTX4090, PlanSettings(tensor_parallel_size=4, pipeline_parallel_size=2)
    )
    assert [stage.layers for stage in plan.stages] == [40, 40]
    assert sum(stage.weight_bytes for stage in plan.stages) == whole


def test_tied_embeddings_cost_the_last_stage_its_own_copy() -> None:
    spec = resolve_model("Qwen3-8B")
    one = evaluate(spec, RTX4090, PlanSettings())
    two = evaluate(spec, RTX4090, PlanSettings(pipeline_parallel_size=2, gpu_count=2))
    staged = sum(stage.weight_bytes for stage in two.stages)
    if spec.tied_embeddings:
        assert staged == one.weights.total + one.weights.embeddings
    else:
        assert staged == one.weights.total


def test_72b_bf16_needs_two_nodes_of_four_24gb_cards() -> None:
    one_node = plan_for(
        QWEN72B,
        RTX4090,
        PlanSettings(tensor_parallel_size=4, gpus_per_node=4, max_model_len=32768),
    )
    assert not one_node.fits and one_node.binding is not None
    assert one_node.binding.code == "weights"
    assert one_node.suggestion is not None
    assert one_node.suggestion.change == "--pp 2 --gpus 8"
    two_nodes = evaluate(
        QWEN72B,
        RTX4090,
        PlanSettings(
            tensor_parallel_size=4, pipeline_parallel_size=2, gpus_per_node=4, max_model_len=32768
        ),
    )
    assert two_nodes.fits and two_nodes.nodes == 2 and two_nodes.replicas == 1
    assert two_nodes.max_sequences >= 1
    assert not two_nodes.warnings


def test_the_stage_with_the_fewest_blocks_binds_the_replica() -> None:
    # 30 layers over 4 stages: 7, 8, 8, 7; the 8-layer stages hold fewer blocks.
    spec = resolve_model("Qwen2.5-7B-Instruct")
    plan = evaluate(spec, RTX4090, PlanSettings(pipeline_parallel_size=4, gpu_count=4))
    blocks = [stage.kv_blocks for stage in plan.stages]
    assert plan.capacity.num_blocks == min(blocks)
    assert plan.stages[plan.binding_stage].kv_blocks == min(blocks)


def test_tensor_parallelism_across_nodes_is_a_warning() -> None:
    plan = evaluate(
        QWEN72B, RTX4090, PlanSettings(tensor_parallel_size=8, gpus_per_node=4, max_model_len=8192)
    )
    assert plan.fits and plan.nodes == 2
    assert any("crosses a node boundary" in warning for warning in plan.warnings)


def test_pipeline_stages_on_the_cpu_engine_are_a_warning() -> None:
    plan = evaluate(
        resolve_model("Qwen2.5-7B-Instruct"),
        get_gpu("cpu"),
        PlanSettings(pipeline_parallel_size=2, max_model_len=4096),
    )
    assert any("pipeline parallelism fails" in warning for warning in plan.warnings)


def test_each_stage_keeps_the_dense_mlp_layers_it_holds() -> None:
    coder = resolve_model("Qwen3-Coder-30B-A3B-Instruct")
    assert coder.moe is not None
    spec = replace(coder, moe=replace(coder.moe, dense_layers=(0, 1, 30)))
    first, second = stage_spec(spec, 0, 24), stage_spec(spec, 24, 48)
    assert first.moe is not None and first.moe.dense_layers == (0, 1)
    assert second.moe is not None and second.moe.dense_layers == (6,)
    assert (first.sparse_layers, second.sparse_layers) == (22, 23)
    whole = weight_bytes(spec, 2, dtype_bytes=2, awq_group_size=None).total
    plan = evaluate(
        spec, get_gpu("h100"), PlanSettings(tensor_parallel_size=2, pipeline_parallel_size=2)
    )
    assert sum(stage.weight_bytes for stage in plan.stages) == whole
