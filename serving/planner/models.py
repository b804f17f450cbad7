"""A model's shapes, as the planner needs them: enough to count every weight and KV byte.

`ModelSpec` holds what a Qwen `config.json` says about the text decoder (plus the size of a
vision encoder, if the checkpoint has one). Hybrid models (Qwen3-Next, Qwen3.5) list which
layers are full attention and which are linear attention (Gated DeltaNet, `GatedDeltaNetSpec`);
only full-attention layers keep a per-token KV cache, linear layers keep a fixed-size state
per sequence. Mixture-of-experts models (`MoeSpec`) change only the MLP: attention, and so the
KV cache, is as dense as any other model's. Reading a `config.json` lives in
`serving.planner.config_json`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from serving.planner.vision import Qwen25VisionConfig

LayerKind = Literal["full_attention", "linear_attention"]
FULL: LayerKind = "full_attention"
LINEAR: LayerKind = "linear_attention"


@dataclass(frozen=True, kw_only=True)
class GatedDeltaNetSpec:
    """The linear-attention layers of a hybrid model (config.json `linear_*` fields).

    Per sequence and layer vLLM keeps a conv state of `conv_dim x (kernel - 1)` values and a
    recurrent state of `value_heads x value_head_dim x key_head_dim` values
    (`MambaStateShapeCalculator.gated_delta_net_state_shape` in vLLM).
    """

    key_heads: int  # linear_num_key_heads
    value_heads: int  # linear_num_value_heads
    key_head_dim: int  # linear_key_head_dim
    value_head_dim: int  # linear_value_head_dim
    conv_kernel: int  # linear_conv_kernel_dim
    # mamba_ssm_dtype in config.json (Qwen3.5: float32); None means the model dtype.
    recurrent_state_bytes: int | None = None

    @property
    def key_dim(self) -> int:
        return self.key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        return self.value_heads * self.value_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the causal conv1d over q, k and v (2 x key_dim + value_dim)."""
        return 2 * self.key_dim + self.value_dim


@dataclass(frozen=True, kw_only=True)
class MoeSpec:
    """Mixture-of-experts MLP (Qwen2-MoE, Qwen3-MoE, Qwen3-Next).

    Each sparse layer holds `num_experts` routed experts (gate/up/down of
    `expert_intermediate`), a router, and optionally one shared expert with its sigmoid gate.
    The layers listed in `dense_layers` keep a dense MLP of the model's `intermediate` size
    instead (config.json `decoder_sparse_step` and `mlp_only_layers`: `dense_mlp_indices`).
    """

    num_experts: int
    experts_per_token: int
    expert_intermediate: int  # moe_intermediate_size
    shared_expert_intermediate: int = 0  # shared_expert_intermediate_size (0: none)
    dense_layers: tuple[int, ...] = ()  # indices of decoder layers with a dense MLP


def dense_mlp_indices(layers: int, sparse_step: int, mlp_only: tuple[int, ...]) -> tuple[int, ...]:
    """Indices of the layers vLLM gives a dense MLP (`Qwen3MoeDecoderLayer`): those listed in
    `mlp_only_layers`, and those whose index + 1 is not a multiple of `decoder_sparse_step`."""
    return tuple(index for index in range(layers) if index in mlp_only or (index + 1) % sparse_step)


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """Shapes of one decoder-only Qwen model (text part), plus an optional vision encoder."""

    name: str
    layers: int  # num_hidden_layers
    hidden: int  # hidden_size
    heads: int  # num_attention_heads
    kv_heads: int  # num_key_value_heads
    head_dim: int
    intermediate: int  # intermediate_size (dense MLP)
    vocab: int  # vocab_size
    tied_embeddings: bool  # tie_word_embeddings
    max_positions: int  # max_position_embeddings
    attention_bias: bool = False  # Qwen2: q/k/v projections carry a bias
    qk_norm: bool = False  # Qwen3 and later: RMSNorm over q and k per head
    attention_output_gate: bool = False  # Qwen3-Next/3.5: q_proj also emits a sigmoid gate
    # vLLM's class names the embedding and the LM head LoRA modules (its `embedding_modules`:
    # the Qwen3 families do, Qwen2's do not), so LoRA adds buffers for them (planner/lora.py).
    lora_embeddings: bool = False
    # One entry per layer; empty means every layer is full attention.
    layer_types: tuple[LayerKind, ...] = ()
    linear: GatedDeltaNetSpec | None = None
    moe: MoeSpec | None = None
    vision_params: int = 0  # parameters of a vision encoder loaded next to the decoder
    # A Qwen2.5-VL encoder's shapes and pixel range: its profiling pass takes memory too.
    vision: Qwen25VisionConfig | None = None
    dtype: str = "bfloat16"  # torch_dtype / dtype in config.json: what "auto" resolves to
    awq_group_size: int | None = None  # set when config.json is an AWQ checkpoint
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.layer_types and len(self.layer_types) != self.layers:
            raise ValueError(
                f"{self.name}: layer_types has {len(self.layer_types)} entries, "
                f"num_hidden_layers is {self.layers}"
            )
        if self.linear_layers and self.linear is None:
            raise ValueError(f"{self.name}: linear-attention layers need linear_* fields")
        if self.moe is not None and any(
            not 0 <= index < self.layers for index in self.moe.dense_layers
        ):
            raise ValueError(f"{self.name}: a dense MLP layer index is outside the layers")

    @property
    def full_attention_layers(self) -> int:
        """Layers with a per-token KV cache."""
        if not self.layer_types:
            return self.layers
        return sum(1 for kind in self.layer_types if kind == FULL)

    @property
    def linear_layers(self) -> int:
        """Layers with a fixed per-sequence state instead of a KV cache."""
        return self.layers - self.full_attention_layers

    @property
    def is_hybrid(self) -> bool:
        return self.linear_layers > 0

    @property
    def sparse_layers(self) -> int:
        """Layers whose MLP is a mixture of experts (0 for a dense model)."""
        return 0 if self.moe is None else self.layers - len(self.moe.dense_layers)

    @property
    def dense_mlp_layers(self) -> int:
        """Layers with a dense MLP of `intermediate`."""
        return self.layers - self.sparse_layers


def hybrid_layer_types(layers: int, full_attention_interval: int) -> tuple[LayerKind, ...]:
    """Qwen3-Next/3.5 layout: every `full_attention_interval`-th layer is full attention."""
    return tuple(
        FULL if (index + 1) % full_attention_interval == 0 else LINEAR for index in range(layers)
    )
