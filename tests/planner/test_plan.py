"""Whole plans: budget, verdict, binding constraint, cheapest change, TP checks, roofline."""

from __future__ import annotations

from dataclasses import replace

import pytest

from serving.errors import ServingError
from serving.planner import PlanSettings, evaluate, get_gpu, plan_for, resolve_model
from serving.planner.gpus import GiB

RTX4090 = get_gpu("rtx-4090")


def test_7b_fp16_32k_on_one_24gb_card_fits_three_sequences() -> None:
    plan = plan_for(
        resolve_model("Qwen2.5-7B-Instruct"), RTX4090, PlanSettings(max_model_len=32768)
    )
    assert plan.fits and plan.binding is None and plan.suggestion is None
    assert plan.weights.total == 15_231_233_024
    budget = plan.usable_bytes - plan.weights.total - plan.activation_bytes
    assert plan.kv_available_bytes == budget - plan.non_torch_bytes - plan.cuda_graph_bytes
    # ~6 GiB of KV at 56 KiB/token: ~110K tokens, 3 sequences of 32K
    assert 90_000 < plan.capacity.tokens < 130_000
    assert plan.max_sequences == 3


def test_7b_fp16_32k_with_less_memory_suggests_fp8_kv_first() -> None:
    settings = PlanSettings(max_model_len=32768, gpu_memory_utilization=0.7)
    plan = plan_for(resolve_model("Qwen2.5-7B-Instruct"), RTX4090, settings)
    assert not plan.fits
    assert plan.binding is not None and plan.binding.code == "kv"
    assert plan.suggestion is not None
    assert plan.suggestion.change == "--kv-cache-dtype fp8"
    assert plan.suggestion.max_sequences >= 1


def test_context_longer_than_the_model_suggests_a_shorter_one() -> None:
    plan = plan_for(
        resolve_model("Qwen2.5-7B-Instruct"), RTX4090, PlanSettings(max_model_len=131072)
    )
    assert plan.problems[0].code == "context"
    assert plan.suggestion is not None and plan.suggestion.change == "--max-model-len 32768"


def test_weights_that_do_not_fit_suggest_more_tp() -> None:
    plan = plan_for(
        resolve_model("Qwen2.5-72B-Instruct"), RTX4090, PlanSettings(max_model_len=8192)
    )
    assert plan.binding is not None and plan.binding.code == "weights"
    assert plan.suggestion is not None and plan.suggestion.change == "--tp 8 --gpus 8"


def test_awq_on_one_card_leaves_room_for_long_context() -> None:
    spec = resolve_model("Qwen2.5-7B-Instruct")
    fp16 = evaluate(spec, RTX4090, PlanSettings(max_model_len=32768))
    awq = evaluate(spec, RTX4090, PlanSettings(max_model_len=32768, quantization="awq"))
    assert awq.weights.total < 0.4 * fp16.weights.total
    assert awq.capacity.tokens > 2 * fp16.capacity.tokens
    assert awq.decode_tokens_s is not None and fp16.decode_tokens_s is not None
    assert awq.decode_tokens_s > 2.5 * fp16.decode_tokens_s


def test_fp8_kv_doubles_capacity() -> None:
    spec = resolve_model("Qwen3-8B")
    auto = evaluate(spec, RTX4090, PlanSettings(max_model_len=16384))
    fp8 = evaluate(spec, RTX4090, PlanSettings(max_model_len=16384, kv_cache_dtype="fp8"))
    assert fp8.kv_bytes_per_token_model * 2 == auto.kv_bytes_per_token_model == 147456
    assert fp8.capacity.num_blocks in (
        2 * auto.capacity.num_blocks,
        2 * auto.capacity.num_blocks + 1,
    )


def test_tp4_plan_of_7b() -> None:
    plan = evaluate(
        resolve_model("Qwen2.5-7B-Instruct"),
        RTX4090,
        PlanSettings(tensor_parallel_size=4, gpu_count=4, max_model_len=32768),
    )
    assert plan.layout.kv_bytes_per_token == 14336  # one KV head per GPU
    assert plan.kv_bytes_per_token_model == 57344
    assert plan.fits and plan.max_sequences > 30


def test_roofline_is_bandwidth_over_weight_bytes() -> None:
    plan = evaluate(resolve_model("Qwen2.5-7B-Instruct"), RTX4090, PlanSettings())
    assert plan.decode_tokens_s == pytest.approx(1008e9 / 15_231_233_024)


def test_cpu_plan_uses_the_kv_space() -> None:
    settings = PlanSettings(max_model_len=8192, kv_space_gib=1)
    plan = plan_for(resolve_model("Qwen3-8B"), get_gpu("cpu"), settings)
    assert plan.layout.block_size == 128
    assert plan.kv_available_bytes == GiB
    assert plan.capacity.tokens == 7168
    assert plan.binding is not None and plan.binding.code == "kv"
    assert plan.decode_tokens_s is None


def test_hybrid_plan_keeps_state_per_sequence() -> None:
    settings = PlanSettings(tensor_parallel_size=4, max_model_len=131072)
    plan = evaluate(resolve_model("Qwen3.5-9B"), RTX4090, settings)
    assert plan.fits
    assert plan.layout.state_groups == 3
    per_sequence = plan.layout.bytes_per_sequence(131072)
    attention_only = -(-131072 // plan.layout.block_size) * plan.layout.bytes_per_block
    assert per_sequence == attention_only + plan.layout.state_bytes_per_sequence


@pytest.mark.parametrize(
    ("model", "settings", "flag"),
    [
        ("Qwen2.5-7B-Instruct", PlanSettings(tensor_parallel_size=8), "--tp"),
        ("Qwen2.5-7B-Instruct", PlanSettings(tensor_parallel_size=3), "--tp"),
        ("Qwen2.5-7B-Instruct", PlanSettings(tensor_parallel_size=4, gpu_count=2), "--gpus"),
        ("Qwen2.5-7B-Instruct", PlanSettings(max_model_len=-1), "--max-model-len"),
        ("Qwen2.5-7B-Instruct", PlanSettings(gpu_memory_utilization=1.5), "--gpu-memory-util"),
        ("Qwen2.5-7B-Instruct", PlanSettings(kv_cache_dtype="int3"), "--kv-cache-dtype"),
        ("Qwen2.5-7B-Instruct", PlanSettings(quantization="gptq"), "--quantization"),
        ("Qwen3.5-27B", PlanSettings(tensor_parallel_size=3), "--tp"),
    ],
)
def test_bad_settings_name_the_flag(model: str, settings: PlanSettings, flag: str) -> None:
    with pytest.raises(ServingError, match=f"^{flag}"):
        evaluate(resolve_model(model), RTX4090, settings)


def test_unknown_gpu_and_model() -> None:
    with pytest.raises(ServingError, match=r"^--gpu: unknown GPU 'v100'"):
        get_gpu("v100")
    with pytest.raises(ServingError, match=r"^--model: unknown model"):
        resolve_model("Llama-3-8B")
    assert get_gpu("RTX 4090").name == "rtx-4090"
    assert resolve_model("Qwen/Qwen2.5-7B-Instruct-AWQ").name == "Qwen2.5-7B-Instruct"


def test_awq_shapes_must_split_into_whole_groups() -> None:
    settings = PlanSettings(tensor_parallel_size=4, max_model_len=32768, quantization="awq")
    base = evaluate(resolve_model("Qwen2.5-72B-Instruct"), RTX4090, settings)
    assert base.binding is not None and base.binding.code == "awq_shape"
    # Qwen's AWQ checkpoint pads intermediate_size to 29696 (= 4 x 58 x 128) and is AWQ itself.
    padded = evaluate(
        resolve_model("Qwen/Qwen2.5-72B-Instruct-AWQ"),
        RTX4090,
        PlanSettings(tensor_parallel_size=4, max_model_len=32768),
    )
    assert padded.settings.quantization == "awq"
    assert padded.fits


def test_language_model_only_drops_the_vision_encoder() -> None:
    spec = resolve_model("Qwen3.5-9B")
    full = evaluate(spec, RTX4090, PlanSettings(max_model_len=32768))
    text = evaluate(spec, RTX4090, PlanSettings(max_model_len=32768, language_model_only=True))
    assert full.weights.total - text.weights.total == 2 * spec.vision_params
    assert text.parameters == full.parameters - spec.vision_params


def test_moe_kv_cache_is_dense_attentions() -> None:
    coder = resolve_model("Qwen3-Coder-30B-A3B-Instruct")
    plan = evaluate(coder, get_gpu("h100"), PlanSettings(max_model_len=131072))
    # 48 layers x 4 KV heads x 128 x K and V x 2 bytes: experts add nothing to the KV cache.
    assert plan.kv_bytes_per_token_model == plan.layout.kv_bytes_per_token == 96 * 1024
    assert plan.fits and plan.weights.total == 61_064_245_248
    assert plan.active_parameters < plan.parameters // 9


def test_tp_must_split_every_expert_evenly() -> None:
    coder = resolve_model("Qwen3-Coder-30B-A3B-Instruct")
    assert coder.moe is not None
    odd = replace(coder, moe=replace(coder.moe, expert_intermediate=100))
    few = replace(coder, moe=replace(coder.moe, num_experts=4))
    for spec in (odd, few):
        with pytest.raises(ServingError, match=r"^--tp: 8 does not divide the experts"):
            evaluate(spec, RTX4090, PlanSettings(tensor_parallel_size=8))
    assert evaluate(odd, RTX4090, PlanSettings(tensor_parallel_size=4)).weights.total > 0


def test_a_pooling_runner_plans_no_lm_head_and_no_sampler() -> None:
    """vLLM's pooling runner builds no LM head (an untied one is not loaded) and runs a pooler
    instead of the sampler: the weights lose the head, the activations the logits pass; the
    KV cache is planned as for generation (vLLM keeps one for a causal pooling model)."""
    spec = resolve_model("Qwen/Qwen3-Reranker-8B")  # untied: its LM head is 1.16 GiB
    settings = PlanSettings(max_model_len=8192, max_num_seqs=1024, max_num_batched_tokens=2048)
    generating = evaluate(spec, RTX4090, settings)
    pooling = evaluate(spec, RTX4090, replace(settings, runner="pooling"))
    head = 151680 * 4096 * 2  # the vocabulary padded to 64 rows, bf16
    assert generating.weights.total - pooling.weights.total == head
    sampler = 1024 * spec.vocab * 4  # float32 logits of max_num_seqs rows
    assert generating.activation_bytes == sampler > pooling.activation_bytes
    assert pooling.layout == generating.layout
    tied = resolve_model("Qwen/Qwen3-Embedding-0.6B")  # the head is the embedding: no change
    assert (
        evaluate(tied, RTX4090, replace(settings, runner="pooling")).weights.total
        == evaluate(tied, RTX4090, settings).weights.total
    )
    with pytest.raises(ServingError, match="--runner: 'draft' is not one of generate, pooling"):
        evaluate(spec, RTX4090, replace(settings, runner="draft"))
