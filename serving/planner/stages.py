"""Pipeline parallelism: which decoder layers each stage holds, and one GPU's memory per stage
(docs/capacity.md, how the numbers are computed).

    pp_partition(80, 2) == (40, 40)     pp_partition(30, 4) == (7, 8, 8, 7)

Rules, as vLLM 0.32's `get_pp_indices` (vllm/distributed/utils.py; VLLM_PP_LAYER_PARTITION
assumed unset):
- every stage gets layers // pp; the remainder goes one each to the stages before the last,
  counting back from the second-to-last;
- a stage's GPU holds its layers' weights and KV cache, the input embedding on the first
  stage, the LM head, final norm and sampler on the last;
- every stage gets the fewest KV blocks any stage can hold, so that stage binds the replica.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from serving.planner.models import ModelSpec


def pp_partition(layers: int, pp: int) -> tuple[int, ...]:
    """Decoder layers per pipeline stage, as vLLM's `get_pp_indices` splits them."""
    partitions = [layers // pp] * pp
    for index in range(2, layers % pp + 2):
        partitions[-index] += 1
    return tuple(partitions)


def pp_ranges(layers: int, pp: int) -> tuple[tuple[int, int], ...]:
    """(start, end) layer indices of each stage, end exclusive."""
    ranges: list[tuple[int, int]] = []
    start = 0
    for count in pp_partition(layers, pp):
        ranges.append((start, start + count))
        start += count
    return tuple(ranges)


def stage_spec(spec: ModelSpec, start: int, end: int) -> ModelSpec:
    """The model as one stage sees it: only layers [start, end), their kinds kept (attention
    kind, and for MoE which of them keep a dense MLP)."""
    kinds = spec.layer_types[start:end] if spec.layer_types else ()
    moe = spec.moe
    if moe is not None:
        dense = tuple(index - start for index in moe.dense_layers if start <= index < end)
        moe = replace(moe, dense_layers=dense)
    return replace(spec, layers=end - start, layer_types=kinds, moe=moe)


@dataclass(frozen=True)
class StageMemory:
    """One GPU of one pipeline stage (sizes in bytes, per GPU)."""

    index: int
    first_layer: int
    last_layer: int  # exclusive
    weight_bytes: int
    activation_bytes: int
    kv_available_bytes: int
    kv_blocks: int
    lora_bytes: int = 0  # LoRA buffers (planner/lora.py); 0 with LoRA off

    @property
    def layers(self) -> int:
        return self.last_layer - self.first_layer


def nodes_needed(gpus: int, gpus_per_node: int) -> int:
    """Machines one replica of `gpus` GPUs spans at `gpus_per_node` each."""
    return -(-gpus // gpus_per_node)
