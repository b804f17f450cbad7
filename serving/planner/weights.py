"""Parameter count and per-GPU weight bytes, from the shapes, the way vLLM shards them
(docs/capacity.md, how the numbers are computed).

Rules:
- tensor parallelism (`ColumnParallelLinear` / `RowParallelLinear`): q/k/v, gate/up and the
  DeltaNet input projections split their outputs; o, down and the DeltaNet output projection
  their inputs; K/V heads are replicated when tp > kv_heads; embeddings and the LM head split
  the vocabulary (padded to 64); norms are replicated;
- mixture of experts (vLLM's `FusedMoE`): every routed expert is loaded, each split over TP
  like a dense MLP (moe_intermediate_size / tp); the router (`GateLinear`) and a shared
  expert's gate are replicated, a shared expert is split like a dense MLP;
- pipeline parallelism (`first_stage` / `last_stage`): the input embedding on the first stage,
  the LM head and final norm on the last, which keeps its own copy of tied embeddings;
- AWQ (4 bit, zero point, group g): qweight int32 [in, out/8], qzeros int32 [in/g, out/8],
  scales fp16 [in/g, out]; embeddings, LM head, norms, biases, MoE routers and the vision
  encoder stay 16 bit.
"""

from __future__ import annotations

from dataclasses import dataclass

from serving.planner.models import ModelSpec

VOCAB_PADDING = 64  # vLLM DEFAULT_VOCAB_PADDING_SIZE
AWQ_PACK = 8  # 4-bit values per int32


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Linear:
    """`count` matrices of one shape, as held by one GPU."""

    name: str
    count: int
    in_features: int
    out_features: int
    bias: bool = False
    quantizable: bool = True  # AWQ checkpoints quantize it
    expert: bool = False  # a routed MoE expert (read only when selected)


@dataclass(frozen=True)
class WeightBytes:
    """One GPU's share of the weights, in bytes."""

    linear: int
    embeddings: int  # input embedding + LM head (unless tied)
    other: int  # norms, DeltaNet conv/dt/A, vision encoder
    routed_experts: int  # part of `linear` that belongs to routed experts

    @property
    def total(self) -> int:
        return self.linear + self.embeddings + self.other


def kv_heads_per_gpu(spec: ModelSpec, tp: int) -> int:
    """KV heads one GPU holds: split when tp <= kv_heads, else one replicated head."""
    return max(1, spec.kv_heads // tp)


def linear_layers(spec: ModelSpec, tp: int) -> list[Linear]:
    """Every linear layer of the decoder, with per-GPU shapes."""
    h = spec.hidden
    full, lin = spec.full_attention_layers, spec.linear_layers
    q_out = spec.heads // tp * spec.head_dim
    kv_out = kv_heads_per_gpu(spec, tp) * spec.head_dim
    gate = 2 if spec.attention_output_gate else 1
    layers = [
        Linear("q_proj", full, h, q_out * gate, bias=spec.attention_bias),
        Linear("k_proj", full, h, kv_out, bias=spec.attention_bias),
        Linear("v_proj", full, h, kv_out, bias=spec.attention_bias),
        Linear("o_proj", full, q_out, h),
    ]
    if spec.linear is not None and lin:
        gdn = spec.linear
        layers += [
            Linear("in_proj_qkv", lin, h, gdn.conv_dim // tp),
            Linear("in_proj_z", lin, h, gdn.value_dim // tp),
            Linear("in_proj_ba", lin, h, 2 * gdn.value_heads // tp),
            Linear("out_proj", lin, gdn.value_dim // tp, h),
        ]
    dense = spec.dense_mlp_layers
    if dense:
        inter = cdiv(spec.intermediate, tp)
        layers += [
            Linear("gate_up_proj", dense, h, 2 * inter),
            Linear("down_proj", dense, inter, h),
        ]
    if spec.moe is None:
        return layers
    moe = spec.moe
    n = spec.sparse_layers
    # Every expert is resident: with TP each GPU holds 1/tp of every expert's intermediate
    # (vLLM's FusedMoE), with expert parallelism 1/tp of the experts whole: the same bytes.
    expert_inter = cdiv(moe.expert_intermediate, tp)
    experts = n * moe.num_experts
    layers += [
        Linear("router", n, h, moe.num_experts, quantizable=False),  # replicated on every GPU
        Linear("expert_gate_up", experts, h, 2 * expert_inter, expert=True),
        Linear("expert_down", experts, expert_inter, h, expert=True),
    ]
    if moe.shared_expert_intermediate:
        shared = cdiv(moe.shared_expert_intermediate, tp)
        layers += [
            Linear("shared_gate_up", n, h, 2 * shared),
            Linear("shared_down", n, shared, h),
            Linear("shared_expert_gate", n, h, 1, quantizable=False),
        ]
    return layers


def embedding_params(
    spec: ModelSpec,
    tp: int,
    *,
    first_stage: bool = True,
    last_stage: bool = True,
    lm_head: bool = True,
) -> int:
    """Input embedding plus LM head (unless tied), one GPU's vocabulary shard, on a stage.
    `lm_head` False: a pooling model, which vLLM builds without one (adapters.py replaces it
    with a stub; a reranker's score row is a few KiB)."""
    shard = cdiv(cdiv(spec.vocab, VOCAB_PADDING) * VOCAB_PADDING, tp) * spec.hidden
    head = last_stage and lm_head
    if first_stage and head:
        return shard if spec.tied_embeddings else 2 * shard
    return shard * (int(first_stage) + int(head))


def other_params(spec: ModelSpec, tp: int, *, last_stage: bool = True) -> int:
    """Norms (replicated), DeltaNet conv1d/dt_bias/A_log (sharded), vision encoder (sharded)."""
    norms = (2 * spec.layers + int(last_stage)) * spec.hidden
    if spec.qk_norm:
        norms += 2 * spec.head_dim * spec.full_attention_layers
    gdn = 0
    if spec.linear is not None:
        g = spec.linear
        norms += g.value_head_dim * spec.linear_layers
        gdn = spec.linear_layers * (g.conv_dim * g.conv_kernel + 2 * g.value_heads) // tp
    return norms + gdn + cdiv(spec.vision_params, tp)


def _bias_params(layer: Linear) -> int:
    return layer.out_features if layer.bias else 0


def param_count(spec: ModelSpec, *, active: bool = False) -> int:
    """All parameters (text decoder + vision encoder), unsharded; `active`: those one token
    uses, counting only `experts_per_token` of each MoE layer's routed experts (as model
    cards count "activated" parameters: embeddings and LM head included)."""
    linear = 0
    for layer in linear_layers(spec, 1):
        params = layer.count * (layer.in_features * layer.out_features + _bias_params(layer))
        if active and layer.expert and spec.moe is not None:
            params = params * spec.moe.experts_per_token // spec.moe.num_experts
        linear += params
    return linear + embedding_params(spec, 1) + other_params(spec, 1)


def awq_linear_bytes(in_features: int, out_features: int, group_size: int) -> int:
    """Bytes of one AWQ 4-bit linear layer: qweight + qzeros (int32) + scales (fp16)."""
    packed = cdiv(out_features, AWQ_PACK)
    groups = cdiv(in_features, group_size)
    return in_features * packed * 4 + groups * packed * 4 + groups * out_features * 2


def weight_bytes(
    spec: ModelSpec,
    tp: int,
    *,
    dtype_bytes: int,
    awq_group_size: int | None,
    first_stage: bool = True,
    last_stage: bool = True,
    lm_head: bool = True,
) -> WeightBytes:
    """One GPU's weight bytes at a precision (`awq_group_size` None: unquantized).

    For one pipeline stage pass that stage's layers as `spec` (`stages.stage_spec`)."""
    linear = 0
    experts = 0
    for layer in linear_layers(spec, tp):
        if awq_group_size is not None and layer.quantizable:
            one = awq_linear_bytes(layer.in_features, layer.out_features, awq_group_size)
        else:
            one = layer.in_features * layer.out_features * dtype_bytes
        one += _bias_params(layer) * dtype_bytes
        linear += layer.count * one
        if layer.expert:
            experts += layer.count * one
    return WeightBytes(
        linear=linear,
        embeddings=embedding_params(
            spec, tp, first_stage=first_stage, last_stage=last_stage, lm_head=lm_head
        )
        * dtype_bytes,
        other=other_params(spec, tp, last_stage=last_stage) * dtype_bytes,
        routed_experts=experts,
    )


def bytes_read_per_token(spec: ModelSpec, weights: WeightBytes) -> int:
    """Weight bytes one decode step reads on one GPU (MoE: only the selected experts)."""
    if spec.moe is None:
        return weights.total
    active = weights.routed_experts * spec.moe.experts_per_token // spec.moe.num_experts
    return weights.total - weights.routed_experts + active


def awq_shape_problem(spec: ModelSpec, tp: int, group_size: int) -> str | None:
    """Why AWQ cannot shard this way (vLLM needs whole groups and packs per GPU), or None."""
    for layer in linear_layers(spec, tp):
        if not layer.quantizable:
            continue
        if layer.in_features % group_size:
            return (
                f"AWQ group size {group_size} does not divide {layer.name}'s per-GPU input "
                f"({layer.in_features}) at tp={tp}; plan the AWQ checkpoint itself, which may pad "
                "its shapes (e.g. --model Qwen2.5-72B-Instruct-AWQ, or its directory)"
            )
        if layer.out_features % AWQ_PACK:
            return f"{layer.name}'s per-GPU output ({layer.out_features}) is not a multiple of 8"
    return None
