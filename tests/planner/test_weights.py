"""Parameter counts and weight bytes, checked against hand-written arithmetic."""

from __future__ import annotations

from dataclasses import replace

from serving.planner.catalog import (
    QWEN3_8B,
    QWEN3_CODER_30B_A3B,
    QWEN3_CODER_480B_A35B,
    QWEN25_7B,
    QWEN35_9B,
)
from serving.planner.models import ModelSpec, MoeSpec
from serving.planner.weights import (
    awq_linear_bytes,
    bytes_read_per_token,
    kv_heads_per_gpu,
    linear_layers,
    param_count,
    weight_bytes,
)

GiB = 1024**3


def test_qwen25_7b_parameters_and_fp16_bytes() -> None:
    h, inter, vocab, layers = 3584, 18944, 152064, 28
    q = h * h + h  # q_proj with bias
    kv = 2 * (h * 512 + 512)  # k_proj, v_proj: 4 heads x 128, with bias
    o = h * h
    mlp = 3 * h * inter
    norms = 2 * h
    per_layer = q + kv + o + mlp + norms
    total = layers * per_layer + 2 * vocab * h + h  # embed + untied lm_head + final norm
    assert total == 7_615_616_512
    assert param_count(QWEN25_7B) == total
    fp16 = weight_bytes(QWEN25_7B, 1, dtype_bytes=2, awq_group_size=None)
    assert fp16.total == 2 * total == 15_231_233_024  # ~15.2 GB
    assert 14.1 < fp16.total / GiB < 14.2


def test_qwen3_8b_parameters() -> None:
    h, inter, vocab, layers = 4096, 12288, 151936, 36
    attention = h * 4096 + 2 * h * 1024 + 4096 * h  # q, k, v, o (no bias)
    per_layer = attention + 2 * 128 + 3 * h * inter + 2 * h  # + q/k norm, MLP, norms
    assert param_count(QWEN3_8B) == layers * per_layer + 2 * vocab * h + h == 8_190_735_360


def test_awq_linear_bytes_formula() -> None:
    # gate_proj of Qwen2.5-7B: in 3584, out 18944, group 128.
    qweight = 3584 * (18944 // 8) * 4  # int32 [in, out/8]
    qzeros = (3584 // 128) * (18944 // 8) * 4  # int32 [in/g, out/8]
    scales = (3584 // 128) * 18944 * 2  # fp16 [in/g, out]
    assert awq_linear_bytes(3584, 18944, 128) == qweight + qzeros + scales == 35_273_728


def test_qwen25_7b_awq_total() -> None:
    def awq(i: int, o: int) -> int:
        return i * o // 2 + (i // 128) * (o // 8) * 4 + (i // 128) * o * 2

    h = 3584
    linear = awq(h, h) + 2 * awq(h, 512) + awq(h, h) + awq(h, 2 * 18944) + awq(18944, h)
    biases_and_norms = (h + 512 + 512) * 2 + 2 * h * 2
    expected = 28 * (linear + biases_and_norms) + 2 * 152064 * h * 2 + h * 2
    got = weight_bytes(QWEN25_7B, 1, dtype_bytes=2, awq_group_size=128)
    assert got.total == expected == 5_570_747_392


def test_tp4_splits_linears_and_vocab_and_replicates_norms() -> None:
    h, tp = 3584, 4
    q = h * (h // tp) + h // tp
    kv = 2 * (h * 128 + 128)  # one KV head of 128 per GPU
    o = (h // tp) * h
    mlp = 3 * h * (18944 // tp)
    per_layer = q + kv + o + mlp + 2 * h
    expected = 28 * per_layer + 2 * (152064 // tp) * h + h
    got = weight_bytes(QWEN25_7B, tp, dtype_bytes=2, awq_group_size=None)
    assert got.total == 2 * expected
    assert kv_heads_per_gpu(QWEN25_7B, 4) == 1


def test_kv_heads_replicated_beyond_their_count() -> None:
    assert kv_heads_per_gpu(QWEN3_8B, 4) == 2
    assert kv_heads_per_gpu(QWEN3_8B, 16) == 1


def test_qwen35_9b_text_parameters_match_published_8_95b() -> None:
    text = param_count(QWEN35_9B) - QWEN35_9B.vision_params
    assert round(text / 1e9, 2) == 8.95


def test_qwen3_coder_30b_a3b_counts_every_expert_as_its_checkpoint_does() -> None:
    h, layers, vocab, experts, inter = 2048, 48, 151936, 128, 768
    attention = h * 4096 + 2 * h * 512 + 4096 * h + 2 * 128  # q, k, v, o, q/k norm
    sparse_mlp = h * experts + experts * 3 * h * inter  # router + every expert's gate/up/down
    per_layer = attention + sparse_mlp + 2 * h
    total = layers * per_layer + 2 * vocab * h + h
    # model.safetensors.index.json of the bf16 checkpoint: total_size 61,064,245,248 bytes.
    assert param_count(QWEN3_CODER_30B_A3B) == total == 61_064_245_248 // 2
    assert weight_bytes(QWEN3_CODER_30B_A3B, 1, dtype_bytes=2, awq_group_size=None).total == (
        61_064_245_248
    )
    # The model card: "30.5B in total and 3.3B activated" (one decimal, rounded down).
    active = param_count(QWEN3_CODER_30B_A3B, active=True)
    assert active == total - layers * (experts - 8) * 3 * h * inter == 3_353_032_704
    assert round(total / 1e9, 1) == 30.5 and 3.3e9 <= active < 3.4e9


def test_qwen3_coder_480b_a35b_matches_its_card() -> None:
    # The model card: "480B in total and 35B activated".
    assert 480e9 <= param_count(QWEN3_CODER_480B_A35B) < 481e9
    assert 35e9 <= param_count(QWEN3_CODER_480B_A35B, active=True) < 36e9
    assert param_count(QWEN3_8B, active=True) == param_count(QWEN3_8B)


def test_tp_splits_every_expert_and_replicates_the_router() -> None:
    spec = QWEN3_CODER_30B_A3B
    one = {layer.name: layer for layer in linear_layers(spec, 1)}
    four = {layer.name: layer for layer in linear_layers(spec, 4)}
    assert four["router"] == one["router"]  # GateLinear is replicated
    assert four["expert_gate_up"].count == one["expert_gate_up"].count == 48 * 128
    assert four["expert_gate_up"].out_features == one["expert_gate_up"].out_features // 4
    assert four["expert_down"].in_features == 768 // 4
    routed_one = weight_bytes(spec, 1, dtype_bytes=2, awq_group_size=None).routed_experts
    routed_four = weight_bytes(spec, 4, dtype_bytes=2, awq_group_size=None).routed_experts
    assert routed_four * 4 == routed_one == 48 * 128 * 3 * 2048 * 768 * 2


def test_layers_with_a_dense_mlp_hold_no_experts() -> None:
    assert spec_moe(QWEN3_CODER_30B_A3B).dense_layers == ()
    spec = replace(
        QWEN3_CODER_30B_A3B, moe=replace(spec_moe(QWEN3_CODER_30B_A3B), dense_layers=(0, 47))
    )
    layers = {layer.name: layer for layer in linear_layers(spec, 2)}
    assert (spec.sparse_layers, spec.dense_mlp_layers) == (46, 2)
    assert layers["expert_down"].count == 46 * 128 and layers["router"].count == 46
    assert layers["gate_up_proj"].count == 2 and layers["gate_up_proj"].out_features == 5472
    difference = param_count(QWEN3_CODER_30B_A3B) - param_count(spec)
    assert difference == 2 * (2048 * 128 + 128 * 3 * 2048 * 768 - 3 * 2048 * 5472)


def test_decode_reads_only_the_selected_experts() -> None:
    weights = weight_bytes(QWEN3_CODER_30B_A3B, 1, dtype_bytes=2, awq_group_size=None)
    read = bytes_read_per_token(QWEN3_CODER_30B_A3B, weights)
    assert read == 2 * param_count(QWEN3_CODER_30B_A3B, active=True)


def spec_moe(spec: ModelSpec) -> MoeSpec:
    assert spec.moe is not None
    return spec.moe
