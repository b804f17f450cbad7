"""Read the LoRA buffers a running vLLM engine allocated, through vLLM's own hooks.

vLLM adds the methods of a `--worker-extension-cls` class to each of its workers, and its
dev-mode route `POST /collective_rpc` (VLLM_SERVER_DEV_MODE=1) calls one by name on every
worker and answers the results as JSON: so a test reads the engine's own tensors while the same
engine serves requests. Nothing here runs outside the worker of a test's engine.
"""

from __future__ import annotations

from typing import Any

# vLLM 0.32's names for the stacked adapter buffers of a LoRA-wrapped layer (vllm/lora/layers):
# a tensor, or a tuple of one tensor per slice of a packed layer.
BUFFERS = ("lora_a_stacked", "lora_b_stacked")


class LoraBuffers:
    """Mixed into vLLM's worker: `self` is the worker."""

    def lora_buffer_bytes(self) -> dict[str, int]:
        """Bytes of every LoRA A/B buffer of this worker's model, by buffer name, each storage
        counted once (the embedding's 2-D view of its A buffer is the same memory)."""
        import torch

        worker: Any = self
        seen: set[int] = set()
        found = {name: 0 for name in BUFFERS}
        found["wrapped_modules"] = 0
        for module in worker.get_model().modules():
            held = [name for name in BUFFERS if hasattr(module, name)]
            found["wrapped_modules"] += bool(held)
            for name in held:
                value = getattr(module, name)
                for tensor in value if isinstance(value, tuple | list) else (value,):
                    assert isinstance(tensor, torch.Tensor)
                    pointer = tensor.untyped_storage().data_ptr()
                    if pointer not in seen:
                        seen.add(pointer)
                        found[name] += tensor.numel() * tensor.element_size()
        return found
