"""The memory vLLM sets aside for LoRA adapters: stacked A and B buffers for every adapted layer
(docs/adapters.md, what the planner adds).

    lora_bytes(spec, tp=1, max_loras=2, max_lora_rank=8, dtype_bytes=2).total

Rules, as vLLM 0.32's `create_lora_weights` (vllm/lora/layers) allocates at start:
- per slice of each wrapped linear layer, in the model dtype:
  `lora_a_stacked` max_loras x 1 x max_lora_rank x in_features and
  `lora_b_stacked` max_loras x 1 x out_features x max_lora_rank;
- column-parallel layers (qkv, gate_up) hold their TP share of out_features, row-parallel ones
  (o, down) of in_features (fully sharded LoRA is not planned);
- Qwen3's `embedding_modules`, whole on every rank: the input embedding A = max_loras x vocab
  x rank, B = max_loras x 1 x hidden x rank; the logits A = max_loras x 1 x rank x hidden,
  B = max_loras x 1 x vocab x rank; Qwen2 wraps neither.
`tests/integration/tenants/test_lora.py` holds this against the buffers the CPU engine allocates.
"""

from __future__ import annotations

from dataclasses import dataclass

from serving.planner.models import ModelSpec
from serving.planner.weights import kv_heads_per_gpu


@dataclass(frozen=True)
class LoraBytes:
    """One GPU's (or CPU rank's) LoRA buffers, in bytes."""

    decoder: int = 0  # the wrapped linear layers of the decoder layers this GPU holds
    embedding: int = 0  # the input embedding's (Qwen3 classes; first pipeline stage)
    lm_head: int = 0  # the logits' (Qwen3 classes; last pipeline stage)

    @property
    def total(self) -> int:
        return self.decoder + self.embedding + self.lm_head


def unplanned(spec: ModelSpec) -> str | None:
    """Why the planner cannot size LoRA buffers for `spec`, or None when it can."""
    kind = "MoE" if spec.moe is not None else "hybrid" if spec.is_hybrid else None
    if kind is None:
        return None
    return f"LoRA buffers are planned for dense models only: {kind} {spec.name}'s count as 0"


def decoder_layer_elements(spec: ModelSpec, tp: int, rank: int) -> int:
    """Values of one adapter slot's A and B buffers for one decoder layer on one GPU."""
    h = spec.hidden
    q_out = spec.heads // tp * spec.head_dim
    kv_out = kv_heads_per_gpu(spec, tp) * spec.head_dim
    inter = spec.intermediate // tp
    qkv = 3 * rank * h + rank * (q_out + 2 * kv_out)  # A per slice is rank x hidden
    o_proj = rank * q_out + rank * h  # input split over TP, output whole
    gate_up = 2 * rank * h + 2 * rank * inter
    down = rank * inter + rank * h
    return qkv + o_proj + gate_up + down


def lora_bytes(
    spec: ModelSpec,
    tp: int,
    *,
    max_loras: int,
    max_lora_rank: int,
    dtype_bytes: int,
    first_stage: bool = True,
    last_stage: bool = True,
) -> LoraBytes:
    """The LoRA buffers one GPU of a stage holds (the whole model without pipeline stages)."""
    if unplanned(spec) is not None:
        return LoraBytes()
    per_slot = dtype_bytes * max_loras
    decoder = per_slot * spec.layers * decoder_layer_elements(spec, tp, max_lora_rank)
    embeddings = per_slot * max_lora_rank * (spec.vocab + spec.hidden)
    return LoraBytes(
        decoder=decoder,
        embedding=embeddings if spec.lora_embeddings and first_stage else 0,
        lm_head=embeddings if spec.lora_embeddings and last_stage else 0,
    )
