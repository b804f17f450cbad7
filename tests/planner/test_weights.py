"""Parameter counts and weight bytes, checked against hand-written arithmetic."""

from __future__ import annotations

from serving.planner.catalog import QWEN3_8B, QWEN25_7B, QWEN35_9B
from serving.planner.weights import (
    awq_linear_bytes,
    kv_heads_per_gpu,
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
