"""A profile's LoRA section: the adapters vLLM serves beside the base model, and its limits.

    lora:
      max_loras: 2          # adapters in one batch (vLLM preallocates a slot for each)
      max_lora_rank: 8      # the largest rank a slot holds: one of vLLM's ranks
      adapters:
        - name: team-a      # the model name clients request
          path: builtin:qwen3-tiny-lora   # or a local PEFT directory, or a hub id
          rank: 8           # the adapter's `r` (adapter_config.json)

The limits size memory that vLLM allocates whether or not adapters are loaded (the planner
counts it), so they are validated here, in vLLM's terms, before vLLM is started.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from serving.paths import BUILTIN_PREFIX
from serving.vllm_limits import DEFAULT_MAX_LORA_RANK, DEFAULT_MAX_LORAS, LORA_RANKS

# A name clients send as `model`: no spaces, and no `,` or `=`, which vLLM's `name=path` form
# of its adapter list (vllm_flags.py renders it) and comma-separated model lists (keys) split on.
ADAPTER_NAME = r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$"


class LoraAdapter(BaseModel):
    """One adapter vLLM loads at start and serves under `name`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=ADAPTER_NAME)
    path: str = Field(min_length=1, description="local PEFT dir, hub id, or builtin:NAME")
    rank: int = Field(ge=1)

    @property
    def builtin(self) -> str | None:
        """The name of a project-built adapter, or None for a path or hub id."""
        if self.path.startswith(BUILTIN_PREFIX):
            return self.path.removeprefix(BUILTIN_PREFIX)
        return None


class Lora(BaseModel):
    """LoRA on for a profile: vLLM's limits and the adapters loaded at start."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_loras: int = Field(default=DEFAULT_MAX_LORAS, ge=1)
    max_lora_rank: int = DEFAULT_MAX_LORA_RANK
    # Adapters kept in host memory, swapped into the max_loras slots on demand (vLLM: max_loras).
    max_cpu_loras: int | None = Field(default=None, ge=1)
    adapters: tuple[LoraAdapter, ...] = ()

    @model_validator(mode="after")
    def _vllm_rules(self) -> Lora:
        if self.max_lora_rank not in LORA_RANKS:
            ranks = ", ".join(map(str, LORA_RANKS))
            raise ValueError(f"max_lora_rank: {self.max_lora_rank} is not one of vLLM's ({ranks})")
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(
                f"max_cpu_loras: {self.max_cpu_loras} is less than max_loras {self.max_loras}"
            )
        seen: set[str] = set()
        for adapter in self.adapters:
            if adapter.name in seen:
                raise ValueError(f"adapters: the name {adapter.name!r} is used twice")
            seen.add(adapter.name)
            if adapter.rank > self.max_lora_rank:
                raise ValueError(
                    f"adapters: {adapter.name} has rank {adapter.rank}, more than max_lora_rank "
                    f"{self.max_lora_rank}"
                )
        return self
