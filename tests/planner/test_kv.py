"""KV bytes per token, hybrid state, and capacity arithmetic (vLLM's block math)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from serving.planner.catalog import QWEN3_8B, QWEN25_7B, QWEN35_9B
from serving.planner.gpus import GiB
from serving.planner.kv import KvLayout, kv_capacity, kv_layout, linear_state_bytes, sequence_fit

SPECS = {"7b": QWEN25_7B, "8b": QWEN3_8B, "9b": QWEN35_9B}


def _layout(
    name: str, tp: int = 1, kv_bytes: int = 2, block: int = 16, prefix: bool = True
) -> KvLayout:
    spec = SPECS[name]
    return kv_layout(
        spec,
        tp,
        kv_dtype_bytes=kv_bytes,
        model_dtype_bytes=2,
        block_size=block,
        kernel_block=16,
        prefix_caching=prefix,
    )


def test_kv_per_token() -> None:
    assert _layout("7b").kv_bytes_per_token == 28 * 4 * 128 * 2 * 2 == 57344  # 56 KiB
    assert _layout("8b").kv_bytes_per_token == 36 * 8 * 128 * 2 * 2 == 147456  # 144 KiB
    assert _layout("7b", tp=4).kv_bytes_per_token == 28 * 1 * 128 * 2 * 2


def test_fp8_halves_kv() -> None:
    assert _layout("8b", kv_bytes=1).kv_bytes_per_token * 2 == _layout("8b").kv_bytes_per_token


def test_hybrid_only_full_attention_layers_carry_kv() -> None:
    layout = _layout("9b")
    assert QWEN35_9B.full_attention_layers == 8 and QWEN35_9B.linear_layers == 24
    assert layout.kv_bytes_per_token == 8 * 2 * 4 * 256 * 2  # 32 KiB, not 32 layers' worth
    conv = (2 * 16 * 128 + 32 * 128) * (4 - 1) * 2  # conv_dim x (kernel-1), bf16
    recurrent = 32 * 128 * 128 * 4  # value heads x v dim x k dim, float32
    assert linear_state_bytes(QWEN35_9B, 1, 2) == layout.state_bytes_per_layer == conv + recurrent
    # the attention block grows until a page holds one layer's state: 16 x ceil(2146304/65536)
    assert layout.block_size == 16 * 33 == 528
    assert (layout.group_size, layout.attention_groups, layout.state_groups) == (8, 1, 3)
    # one sequence: its attention blocks plus 2 state blocks per linear group (prefix caching)
    assert layout.blocks_per_sequence(131072) == -(-131072 // 528) + 3 * 2
    assert _layout("9b", prefix=False).blocks_per_sequence(131072) == -(-131072 // 528) + 3


def test_capacity_uniform_model() -> None:
    layout = _layout("7b")
    capacity = kv_capacity(layout, 6 * GiB, 32768)
    assert capacity.num_blocks == 6 * GiB // (28 * 16 * 4 * 128 * 2 * 2)
    assert capacity.tokens == int(capacity.num_blocks / 2048 * 32768)


def test_cpu_capacity_from_kv_space() -> None:
    layout = _layout("8b", block=128)
    page = 128 * 8 * 128 * 2 * 2  # one layer, one block of 128 tokens
    capacity = kv_capacity(layout, 1 * GiB, 8192)
    assert capacity.num_blocks == GiB // (36 * page) == 56
    assert capacity.tokens == 56 * 128 == 7168
    assert capacity.max_concurrency == 56 / 64


@given(
    available=st.integers(min_value=0, max_value=80 * GiB),
    length=st.integers(min_value=1, max_value=262144),
)
def test_capacity_never_exceeds_the_pool(available: int, length: int) -> None:
    for layout in (_layout("7b"), _layout("9b")):
        capacity = kv_capacity(layout, available, length)
        assert capacity.num_blocks * layout.bytes_per_block <= available
        assert capacity.tokens <= capacity.num_blocks * layout.block_size


def test_sequences_that_fit_leave_out_vllms_null_block() -> None:
    layout = _layout("8b", block=128)
    per_block = layout.bytes_per_block
    # 33 blocks: 32 usable hold four sequences of 8 blocks, and not one token more.
    fit = sequence_fit(layout, kv_capacity(layout, 33 * per_block, 1024), 1024)
    assert (fit.blocks_per_sequence, fit.usable_blocks, fit.sequences) == (8, 32, 4)
    assert fit.usage == 1.0 and fit.usage_at(2) == 0.5
    # 32 blocks: vLLM's max concurrency says 4, but its block pool holds only 3.
    tight = kv_capacity(layout, 32 * per_block, 1024)
    assert tight.max_concurrency == 4.0
    assert sequence_fit(layout, tight, 1024).sequences == 3
    assert sequence_fit(layout, tight, 1025).blocks_per_sequence == 9
