"""KV cache layout and capacity, computed the way vLLM (v1 engine) computes them
(docs/capacity.md, how the numbers are computed).

Mirrors vllm/v1/core/kv_cache_utils.py (vLLM 0.32):
- `get_kv_cache_config_from_groups`: num_blocks = available_bytes // bytes_per_block (a block
  holds `block_size` tokens of every layer in the largest KV cache group);
- `get_max_concurrency_for_kv_cache_config`: num_blocks / the blocks one max_model_len
  request needs, summed over groups;
- `get_kv_cache_capacity`: "KV cache size: N tokens" = int(concurrency x max_model_len);
- hybrid models (`Platform._align_hybrid_block_size`, `_get_kv_cache_groups_uniform_page_size`):
  the attention block grows until a page holds a linear layer's state, state pages are padded
  to it, groups have min(#full, #linear) layers, and each linear group takes 1 block per
  sequence (2 with prefix caching), each attention group cdiv(max_model_len, block_size).
"""

from __future__ import annotations

from dataclasses import dataclass

from serving.planner.models import ModelSpec
from serving.planner.weights import cdiv, kv_heads_per_gpu

GPU_BLOCK_SIZE = 16  # vLLM CacheConfig.DEFAULT_BLOCK_SIZE (CUDA attention backends)
CPU_BLOCK_SIZE = 128  # vllm/platforms/cpu.py: block_size = 128 unless block_size is set
GPU_KERNEL_BLOCK = 16  # smallest kernel block of FlashAttention/FlashInfer/Triton (MultipleOf(16))
CPU_KERNEL_BLOCK = 32  # vllm/v1/attention/backends/cpu_attn.py: MultipleOf(32)


@dataclass(frozen=True)
class KvLayout:
    """How one GPU's KV cache is paged (all sizes per GPU)."""

    block_size: int  # tokens per block, after hybrid alignment
    attention_bytes_per_token_layer: int  # 2 x kv_heads_per_gpu x head_dim x dtype bytes
    kv_bytes_per_token: int  # summed over full-attention layers
    state_bytes_per_layer: int  # one linear layer's conv + recurrent state for one sequence
    page_bytes: int  # one layer's share of one block
    group_size: int  # layers per KV cache group
    attention_groups: int
    state_groups: int
    state_blocks_per_group: int  # per sequence: 1, or 2 with prefix caching

    @property
    def bytes_per_block(self) -> int:
        return self.group_size * self.page_bytes

    @property
    def state_bytes_per_sequence(self) -> int:
        """Fixed per-sequence memory of the linear layers, as allocated (padded pages)."""
        return self.state_groups * self.state_blocks_per_group * self.bytes_per_block

    def blocks_per_sequence(self, max_model_len: int) -> int:
        attention = self.attention_groups * cdiv(max_model_len, self.block_size)
        return attention + self.state_groups * self.state_blocks_per_group

    def bytes_per_sequence(self, max_model_len: int) -> int:
        """KV cache one sequence of max_model_len tokens takes (what vLLM checks at start)."""
        return self.blocks_per_sequence(max_model_len) * self.bytes_per_block


@dataclass(frozen=True)
class KvCapacity:
    num_blocks: int
    max_concurrency: float  # vLLM: "Maximum concurrency for N tokens per request: X"
    tokens: int  # vLLM: "GPU KV cache size: N tokens"


def linear_state_bytes(spec: ModelSpec, tp: int, state_dtype_bytes: int) -> int:
    """One linear-attention layer's state for one sequence on one GPU (0 if not hybrid).

    conv: conv_dim/tp x (kernel - 1) values in the model dtype; recurrent:
    value_heads/tp x value_head_dim x key_head_dim values in mamba_ssm_dtype.
    """
    if spec.linear is None or not spec.is_hybrid:
        return 0
    g = spec.linear
    conv = g.conv_dim // tp * (g.conv_kernel - 1) * state_dtype_bytes
    recurrent_bytes = g.recurrent_state_bytes or state_dtype_bytes
    recurrent = g.value_heads // tp * g.value_head_dim * g.key_head_dim * recurrent_bytes
    return conv + recurrent


def kv_layout(
    spec: ModelSpec,
    tp: int,
    *,
    kv_dtype_bytes: int,
    model_dtype_bytes: int,
    block_size: int,
    kernel_block: int,
    prefix_caching: bool,
) -> KvLayout:
    per_token_layer = 2 * kv_heads_per_gpu(spec, tp) * spec.head_dim * kv_dtype_bytes
    full = spec.full_attention_layers
    state = linear_state_bytes(spec, tp, model_dtype_bytes)
    if not state:
        return KvLayout(
            block_size=block_size,
            attention_bytes_per_token_layer=per_token_layer,
            kv_bytes_per_token=full * per_token_layer,
            state_bytes_per_layer=0,
            page_bytes=block_size * per_token_layer,
            group_size=full,
            attention_groups=1,
            state_groups=0,
            state_blocks_per_group=0,
        )
    alignment = max(kernel_block, block_size)
    aligned = alignment * cdiv(state, alignment * per_token_layer)
    block_size = max(block_size, aligned)
    linear = spec.linear_layers
    group_size = min(full, linear)
    if max(full, linear) < 1.5 * group_size:
        group_size = max(full, linear)
    return KvLayout(
        block_size=block_size,
        attention_bytes_per_token_layer=per_token_layer,
        kv_bytes_per_token=full * per_token_layer,
        state_bytes_per_layer=state,
        page_bytes=block_size * per_token_layer,
        group_size=group_size,
        attention_groups=cdiv(full, group_size),
        state_groups=cdiv(linear, group_size),
        state_blocks_per_group=2 if prefix_caching else 1,
    )


def kv_capacity(layout: KvLayout, available_bytes: int, max_model_len: int) -> KvCapacity:
    """Blocks, concurrency and token capacity for `available_bytes` of KV cache space."""
    num_blocks = max(0, available_bytes) // layout.bytes_per_block
    concurrency = num_blocks / layout.blocks_per_sequence(max_model_len)
    return KvCapacity(
        num_blocks=num_blocks,
        max_concurrency=concurrency,
        tokens=int(concurrency * max_model_len),
    )


# vllm/v1/core/block_pool.py: BlockPool takes one block out of the free queue at start (the
# null block, a placeholder that holds no tokens); `get_usage` divides by the blocks left.
NULL_BLOCKS = 1


@dataclass(frozen=True)
class SequenceFit:
    """How many sequences of one length a KV cache holds at once, and how full it is then.

    A sequence of `tokens` tokens (prompt + output) holds `blocks_per_sequence` blocks;
    `usable_blocks` leaves out vLLM's null block. vLLM's scheduler admits a waiting request
    while the free blocks hold its prompt, so with prompts that already fill every block a
    sequence will need, `sequences` run at once and one more waits; the cache is then
    `usage` full (vllm:kv_cache_usage_perc, 0..1).
    """

    tokens: int
    blocks_per_sequence: int
    usable_blocks: int
    sequences: int
    usage: float  # sequences x blocks_per_sequence / usable_blocks

    def usage_at(self, concurrency: int) -> float:
        """Predicted vllm:kv_cache_usage_perc with `concurrency` such sequences in flight."""
        held = min(concurrency, self.sequences) * self.blocks_per_sequence
        return held / self.usable_blocks if self.usable_blocks else 0.0


def sequence_fit(layout: KvLayout, capacity: KvCapacity, tokens: int) -> SequenceFit:
    """Sequences of `tokens` tokens that `capacity` holds at once (see SequenceFit)."""
    per_sequence = layout.blocks_per_sequence(tokens)
    usable = max(0, capacity.num_blocks - NULL_BLOCKS)
    sequences = usable // per_sequence
    return SequenceFit(
        tokens=tokens,
        blocks_per_sequence=per_sequence,
        usable_blocks=usable,
        sequences=sequences,
        usage=sequences * per_sequence / usable if usable else 0.0,
    )
