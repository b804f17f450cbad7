"""vLLM's own defaults and limits that a profile and the planner assume: written once, here.

A module of plain constants that imports nothing, so that the profiles (which validate against
them) and `vllm_flags` (which renders a profile, and re-exports these for the planner) do not
import each other: `vllm_flags` reads `Profile`, and the profiles read only this.
"""

from __future__ import annotations

# vLLM's own default share of GPU memory for weights, activations and the KV cache: what a
# profile and the planner assume when they set none.
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
# vLLM's LoRA limits (LoRAConfig, vllm/config/lora.py): its defaults for adapters in one batch
# and the largest rank, and the only ranks it accepts as that largest rank (MaxLoRARanks).
DEFAULT_MAX_LORAS = 1
DEFAULT_MAX_LORA_RANK = 16
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# vLLM's stream_interval: tokens it buffers per streamed event (1: an event per token). A
# profile may raise it; the gateway reads the count per event when it meters a cut stream.
DEFAULT_STREAM_INTERVAL = 1
