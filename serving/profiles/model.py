"""A deployment profile: one model on one kind of machine at one precision and context.

Profiles are data (YAML files beside this module); this model validates them so that a typo
or an impossible value fails before vLLM is ever started, with one line naming the field.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# A model reference of this form names a model the project builds itself.
BUILTIN_PREFIX = "builtin:"

Dtype = Literal["auto", "float16", "bfloat16", "float32"]
Quantization = Literal["none", "awq"]
KvCacheDtype = Literal["auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"]
Device = Literal["cpu", "gpu"]
GIB = 1 << 30


class Profile(BaseModel):
    """Everything needed to start vLLM for one deployment (and to plan its memory)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    description: str = ""
    device: Device
    gpu: str | None = Field(default=None, description="GPU type for the planner, e.g. rtx-4090")
    gpu_count: int = Field(default=1, ge=1)

    model: str = Field(min_length=1, description="local path, hub name, or builtin:NAME")
    served_model_name: str = Field(min_length=1)
    tokenizer: str | None = None
    dtype: Dtype = "auto"
    quantization: Quantization = "none"
    tensor_parallel_size: int = Field(default=1, ge=1)
    distributed_executor_backend: Literal["mp", "ray"] | None = None
    max_model_len: int = Field(ge=16)
    gpu_memory_utilization: float = Field(default=0.9, gt=0.0, le=1.0)
    max_num_seqs: int = Field(default=256, ge=1)
    max_num_batched_tokens: int | None = Field(default=None, ge=16)
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    kv_cache_dtype: KvCacheDtype = "auto"
    block_size: int | None = Field(default=None, ge=1)
    enforce_eager: bool = False
    cpu_offload_gb: float = Field(default=0.0, ge=0.0)
    kv_offloading_size_gib: float | None = Field(default=None, gt=0.0)
    # The CPU engine's KV cache in bytes, for sizes VLLM_CPU_KVCACHE_SPACE (whole GiB) cannot
    # say: a cache small enough to fill with a few sequences (the memory-plan load test).
    kv_cache_memory_bytes: int | None = Field(default=None, ge=1)
    env: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _consistent(self) -> Profile:
        if self.tensor_parallel_size > self.gpu_count and self.device == "gpu":
            raise ValueError(
                f"tensor_parallel_size {self.tensor_parallel_size} needs at least that many "
                f"GPUs, gpu_count is {self.gpu_count}"
            )
        if (
            not self.enable_chunked_prefill
            and self.max_num_batched_tokens is not None
            and self.max_num_batched_tokens < self.max_model_len
        ):
            raise ValueError(
                "max_num_batched_tokens must be >= max_model_len when chunked prefill is off"
            )
        if self.device == "gpu" and self.gpu is None:
            raise ValueError("gpu is required for a gpu profile (e.g. rtx-4090)")
        if self.kv_cache_memory_bytes is not None:
            if self.device != "cpu":
                raise ValueError("kv_cache_memory_bytes is for cpu profiles (GPUs: utilization)")
            if "VLLM_CPU_KVCACHE_SPACE" in self.env:
                # vLLM's CPU platform lets the variable win over the flag: one size only.
                raise ValueError(
                    "set kv_cache_memory_bytes or env VLLM_CPU_KVCACHE_SPACE, not both"
                )
        return self

    @property
    def builtin_model(self) -> str | None:
        """The name of a project-built model, or None for a path or hub name."""
        if self.model.startswith(BUILTIN_PREFIX):
            return self.model.removeprefix(BUILTIN_PREFIX)
        return None

    @property
    def cpu_kv_space_gib(self) -> float | None:
        """KV cache space the CPU engine gets: kv_cache_memory_bytes, else VLLM_CPU_KVCACHE_SPACE
        (whole GiB, vLLM's default 4)."""
        if self.device != "cpu":
            return None
        if self.kv_cache_memory_bytes is not None:
            return self.kv_cache_memory_bytes / GIB
        return float(self.env.get("VLLM_CPU_KVCACHE_SPACE", "4"))
