"""A deployment profile: one model on one kind of machine at one precision and context.

Profiles are data (YAML files beside this module); this model validates them so that a typo
or an impossible value fails before vLLM is ever started, with one line naming the field.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator, model_validator

from serving.paths import BUILTIN_PREFIX
from serving.profiles.lora import Lora
from serving.profiles.pooling import (
    GENERATION_ONLY,
    Convert,
    PoolerConfig,
    Runner,
    check_chat_template,
)
from serving.vllm_limits import DEFAULT_GPU_MEMORY_UTILIZATION, DEFAULT_STREAM_INTERVAL

# A model reference of this form names a model the project builds itself.

Dtype = Literal["auto", "float16", "bfloat16", "float32"]
Quantization = Literal["none", "awq"]
KvCacheDtype = Literal["auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"]
Device = Literal["cpu", "gpu"]
MODALITIES = ("image", "video", "audio")  # vLLM's names in limit_mm_per_prompt
ToolStrictLevel = Literal["auto", "function", "parameter"]
StructuredOutputsBackend = Literal["auto", "xgrammar", "guidance", "outlines", "lm-format-enforcer"]
GIB = 1 << 30


class StructuredOutputs(BaseModel):
    """How vLLM constrains output to a JSON schema, regex or grammar (`response_format`,
    `tool_choice="required"` or a named tool)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: StructuredOutputsBackend = "auto"
    # JSON without free whitespace: a weak model otherwise fills the grammar's optional
    # whitespace until max_tokens and never closes the object.
    disable_any_whitespace: bool = False

    @model_validator(mode="after")
    def _supported(self) -> StructuredOutputs:
        if self.disable_any_whitespace and self.backend not in ("xgrammar", "guidance"):
            # vLLM's own rule (StructuredOutputsConfig), said before vLLM starts.
            raise ValueError(
                "structured_outputs.disable_any_whitespace needs backend xgrammar or guidance, "
                f"not {self.backend!r}"
            )
        return self


class Profile(BaseModel):
    """Everything needed to start vLLM for one deployment (and to plan its memory)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    description: str = ""
    device: Device
    gpu: str | None = Field(default=None, description="GPU type for the planner, e.g. rtx-4090")
    gpu_count: int = Field(default=1, ge=1, description="GPUs per node (machine)")
    # Machines one replica spans: vLLM on a Ray cluster, `gpu_count` GPUs on each.
    nodes: int = Field(default=1, ge=1)

    model: str = Field(min_length=1, description="local path, hub name, or builtin:NAME")
    served_model_name: str = Field(min_length=1)
    tokenizer: str | None = None
    dtype: Dtype = "auto"
    quantization: Quantization = "none"
    tensor_parallel_size: int = Field(default=1, ge=1)
    pipeline_parallel_size: int = Field(default=1, ge=1)
    distributed_executor_backend: Literal["mp", "ray"] | None = None
    max_model_len: int = Field(ge=16)
    gpu_memory_utilization: float = Field(default=DEFAULT_GPU_MEMORY_UTILIZATION, gt=0.0, le=1.0)
    max_num_seqs: int = Field(default=256, ge=1)
    # vLLM's order for waiting requests: first come, or by the request's `priority` (lower
    # first), which the gateway sets from the key's priority class (`serving up` turns it on).
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    max_num_batched_tokens: int | None = Field(default=None, ge=16)
    # Tokens per event of chat and completion streams: `serving up` gives it to the gateway,
    # which asks vLLM for it per request (vLLM's request field, not its engine flag, which
    # would merge Responses streams too, charged per event when cut). Fewer events cost vLLM's
    # API server less per token, which other requests on a busy engine feel
    # (docs/fair-sharing.md). 1: an event per token.
    stream_interval: int = Field(default=DEFAULT_STREAM_INTERVAL, ge=1, le=64)
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
    # Multimodal items one prompt may carry, per modality (vLLM's limit_mm_per_prompt):
    # `{image: 4, video: 0}`. Empty: vLLM's defaults. The gateway refuses more images.
    limit_mm_per_prompt: dict[str, int] = Field(default_factory=dict)
    # Tool calling and reasoning, as vLLM parses them out of the model's text (names of vLLM's
    # parsers: Qwen2.5 and Qwen3 write `hermes` tool calls, Qwen3 thinks for `qwen3`).
    tool_call_parser: str | None = Field(default=None, min_length=1)
    enable_auto_tool_choice: bool = False
    # How far vLLM's grammar holds tool calls: "auto" constrains the call's markup and name
    # when a tool is required or named, and its arguments only for tools marked `strict`;
    # "parameter" holds every call's arguments to the tool's JSON schema.
    tool_strict_level: ToolStrictLevel = "auto"
    reasoning_parser: str | None = Field(default=None, min_length=1)
    structured_outputs: StructuredOutputs = Field(default_factory=StructuredOutputs)
    # Chat template arguments every request gets unless it sets its own (enable_thinking).
    default_chat_template_kwargs: dict[str, JsonValue] = Field(default_factory=dict)
    # LoRA adapters served beside the base model, and vLLM's limits for them (profiles/lora.py).
    lora: Lora | None = None
    # Generating text, or pooling (embeddings, scores), with the fields that say how
    # (profiles/pooling.py); config.json fields vLLM reads instead of the checkpoint's.
    runner: Runner = "generate"
    convert: Convert | None = None
    pooler_config: PoolerConfig | None = None
    hf_overrides: dict[str, JsonValue] = Field(default_factory=dict)
    # The template vLLM renders prompts with instead of the tokenizer's: `builtin:NAME`
    # (serving/profiles/templates/NAME.jinja) or a path.
    chat_template: str | None = Field(default=None, min_length=1)
    env: dict[str, str] = Field(default_factory=dict)

    @field_validator("chat_template")
    @classmethod
    def _known_template(cls, value: str | None) -> str | None:
        if value is not None:
            check_chat_template(value)
        return value

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
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            raise ValueError("enable_auto_tool_choice needs tool_call_parser (e.g. hermes)")
        if self.device == "gpu" and self.gpu is None:
            raise ValueError("gpu is required for a gpu profile (e.g. rtx-4090)")
        for modality, count in self.limit_mm_per_prompt.items():
            if modality not in MODALITIES or count < 0:
                raise ValueError(
                    f"limit_mm_per_prompt: {modality}: {count} (modalities: "
                    f"{', '.join(MODALITIES)}; counts >= 0)"
                )
        if self.kv_cache_memory_bytes is not None:
            if self.device != "cpu":
                raise ValueError("kv_cache_memory_bytes is for cpu profiles (GPUs: utilization)")
            if "VLLM_CPU_KVCACHE_SPACE" in self.env:
                # vLLM's CPU platform lets the variable win over the flag: one size only.
                raise ValueError(
                    "set kv_cache_memory_bytes or env VLLM_CPU_KVCACHE_SPACE, not both"
                )
        return self

    @model_validator(mode="after")
    def _runner(self) -> Profile:
        if self.runner == "generate":
            for name in ("convert", "pooler_config"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name}: only for runner pooling (runner is generate)")
            return self
        for name, unset in GENERATION_ONLY.items():
            if getattr(self, name) != unset:
                raise ValueError(f"{name}: runner pooling generates no text to parse; remove it")
        if self.structured_outputs != StructuredOutputs():
            raise ValueError("structured_outputs: runner pooling generates no text; remove it")
        return self

    @model_validator(mode="after")
    def _adapter_names(self) -> Profile:
        for adapter in self.lora.adapters if self.lora else ():
            if adapter.name == self.served_model_name:
                # vLLM would answer that name with the base model or the adapter, not both.
                raise ValueError(
                    f"lora.adapters: {adapter.name!r} is the served_model_name; name the "
                    "adapter differently"
                )
        return self

    @model_validator(mode="after")
    def _parallel(self) -> Profile:
        """Stages x TP against the GPUs and nodes; one line naming the field."""
        world = self.tensor_parallel_size * self.pipeline_parallel_size
        if self.device == "cpu" and self.pipeline_parallel_size > 1:
            raise ValueError(
                "pipeline_parallel_size: > 1 fails in vLLM 0.32's CPU build (its second stage "
                "gets no intermediate tensors); on CPUs split with tensor_parallel_size"
            )
        if self.device == "gpu" and world > self.gpu_count * self.nodes:
            raise ValueError(
                f"pipeline_parallel_size x tensor_parallel_size = {world} needs that many "
                f"GPUs, nodes x gpu_count is {self.nodes * self.gpu_count}"
            )
        if self.nodes == 1:
            return self
        if self.distributed_executor_backend != "ray":
            raise ValueError(f"distributed_executor_backend: must be ray for nodes {self.nodes}")
        if self.device == "gpu" and world != self.gpu_count * self.nodes:
            # vLLM's Ray executor spreads one replica's workers; a spare GPU would sit idle.
            raise ValueError(
                f"nodes: {self.nodes} x gpu_count {self.gpu_count} must equal "
                f"pipeline_parallel_size x tensor_parallel_size = {world}"
            )
        if world < self.nodes:
            raise ValueError(f"nodes: {self.nodes} exceeds the {world} workers of one replica")
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
