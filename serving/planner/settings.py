"""The knobs a plan depends on (vLLM's engine arguments), checked and with vLLM's defaults.

    PlanSettings(tensor_parallel_size=4, max_model_len=32768, kv_cache_dtype="fp8")

Unset values (None) take the default vLLM would use on that device: max_model_len from the
model's max_position_embeddings; max_num_seqs and max_num_batched_tokens from
`EngineArgs.get_batch_defaults` for the OpenAI server (vllm/engine/arg_utils.py);
block_size 16 on GPUs, 128 on the CPU engine; CPU KV space 4 GiB.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from serving.errors import ServingError
from serving.planner.gpus import GiB, GpuSpec
from serving.planner.kv import CPU_BLOCK_SIZE, GPU_BLOCK_SIZE
from serving.planner.models import ModelSpec
from serving.planner.precision import check_quantization, kv_dtype_bytes, model_dtype_bytes
from serving.vllm_flags import (
    DEFAULT_GPU_MEMORY_UTILIZATION,
    DEFAULT_MAX_LORA_RANK,
    DEFAULT_MAX_LORAS,
    LORA_RANKS,
    engine_flag,
)

CPU_KV_SPACE_GIB = 4.0  # vLLM's documented default for VLLM_CPU_KVCACHE_SPACE
RUNNERS = ("generate", "pooling")  # the vLLM runners a plan knows


@dataclass(frozen=True, kw_only=True)
class PlanSettings:
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1  # stages, each tensor_parallel_size GPUs
    gpu_count: int | None = None  # all GPUs; None: tp x pp (one replica)
    gpus_per_node: int | None = None  # GPUs in one machine; None: all on one machine
    dtype: str = "auto"
    quantization: str = "none"  # none | awq
    awq_group_size: int = 128
    kv_cache_dtype: str = "auto"
    max_model_len: int | None = None
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    kv_space_gib: float | None = None  # CPU engine: VLLM_CPU_KVCACHE_SPACE
    block_size: int | None = None
    prefix_caching: bool = True
    enforce_eager: bool = False  # no CUDA graphs, so no graph memory
    language_model_only: bool = False  # vLLM's language_model_only: no vision encoder loaded
    # vLLM's runner: `pooling` (embeddings, scores) loads no LM head and samples nothing.
    # The KV cache is planned the same: vLLM keeps one for a causal pooling model.
    runner: str = "generate"
    images_per_prompt: int | None = None  # limit_mm_per_prompt's image; None: vLLM's 999
    # LoRA on: vLLM preallocates max_loras adapter slots of max_lora_rank (planner/lora.py).
    enable_lora: bool = False
    max_loras: int = DEFAULT_MAX_LORAS
    max_lora_rank: int = DEFAULT_MAX_LORA_RANK


def _batch_defaults(gpu: GpuSpec, tp: int) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) vLLM's API server picks for this device."""
    if gpu.is_cpu:
        return 2048 * tp, 128 * tp
    if gpu.memory_bytes >= 160 * GiB:
        return 16384, 1024
    if gpu.memory_bytes >= 70 * GiB and "a100" not in gpu.name:
        return 8192, 1024
    return 2048, 256


def _positive(value: float | None, flag: str) -> None:
    if value is not None and value <= 0:
        raise ServingError(f"{flag}: must be > 0, got {value}")


def _check_tp(spec: ModelSpec, tp: int) -> None:
    if tp < 1:
        raise ServingError(f"--tp: must be >= 1, got {tp}")
    if spec.heads % tp:
        raise ServingError(
            f"--tp: {tp} does not divide the {spec.heads} attention heads of {spec.name}"
        )
    if spec.kv_heads % tp and tp % spec.kv_heads:
        raise ServingError(
            f"--tp: {tp} and the {spec.kv_heads} KV heads of {spec.name} must divide one another"
        )
    g = spec.linear
    if g is not None and spec.is_hybrid and (g.key_heads % tp or g.value_heads % tp):
        raise ServingError(
            f"--tp: {tp} does not divide the linear-attention heads "
            f"({g.key_heads} key, {g.value_heads} value) of {spec.name}"
        )
    moe = spec.moe
    # vLLM refuses tp > num_experts (Qwen3MoeSparseMoeBlock) and asserts that TP splits
    # every expert's intermediate evenly (FusedMoEConfig).
    if moe is not None and (tp > moe.num_experts or moe.expert_intermediate % tp):
        raise ServingError(
            f"--tp: {tp} does not divide the experts of {spec.name} ({moe.num_experts} "
            f"experts of intermediate size {moe.expert_intermediate})"
        )


def _check_pp(spec: ModelSpec, pp: int) -> None:
    if pp < 1:
        raise ServingError(f"--pp: must be >= 1, got {pp}")
    if pp > spec.layers:
        raise ServingError(f"--pp: {pp} stages exceed the {spec.layers} layers of {spec.name}")


def _check_lora(settings: PlanSettings) -> None:
    if settings.max_loras < 1:
        raise ServingError(f"{engine_flag('max_loras')}: must be >= 1, got {settings.max_loras}")
    if settings.max_lora_rank not in LORA_RANKS:
        ranks = ", ".join(map(str, LORA_RANKS))
        raise ServingError(
            f"{engine_flag('max_lora_rank')}: {settings.max_lora_rank} is not one of vLLM's "
            f"({ranks})"
        )


def resolve(spec: ModelSpec, gpu: GpuSpec, settings: PlanSettings) -> PlanSettings:
    """Check every value (ServingError naming the flag) and fill in vLLM's defaults."""
    tp = settings.tensor_parallel_size
    pp = settings.pipeline_parallel_size
    _check_tp(spec, tp)
    _check_pp(spec, pp)
    gpu_count = tp * pp if settings.gpu_count is None else settings.gpu_count
    if gpu_count < tp * pp and not gpu.is_cpu:
        raise ServingError(
            f"--gpus: {gpu_count} GPUs cannot hold tensor parallelism {tp} x "
            f"pipeline parallelism {pp}"
        )
    for value, flag in (
        (settings.max_model_len, engine_flag("max_model_len")),
        (settings.max_num_seqs, engine_flag("max_num_seqs")),
        (settings.max_num_batched_tokens, engine_flag("max_num_batched_tokens")),
        (settings.kv_space_gib, "--kv-space-gib"),
        (settings.block_size, engine_flag("block_size")),
        (settings.awq_group_size, "--awq-group-size"),
        (gpu_count, "--gpus"),
        (settings.gpus_per_node, "--gpus-per-node"),
    ):
        _positive(value, flag)
    _check_lora(settings)
    utilization = settings.gpu_memory_utilization
    if not 0 < utilization <= 1:
        flag = engine_flag("gpu_memory_utilization")
        raise ServingError(f"{flag}: must be in (0, 1], got {utilization}")
    model_dtype_bytes(settings.dtype, spec.dtype)
    kv_dtype_bytes(settings.kv_cache_dtype, 2)
    check_quantization(settings.quantization)
    if settings.runner not in RUNNERS:
        flag = engine_flag("runner")
        raise ServingError(f"{flag}: {settings.runner!r} is not one of {', '.join(RUNNERS)}")
    batched, seqs = _batch_defaults(gpu, tp)
    # vLLM reads quantization_config from an AWQ checkpoint's config.json by itself.
    quantization = "awq" if spec.awq_group_size else settings.quantization
    return replace(
        settings,
        gpu_count=gpu_count,
        quantization=quantization,
        awq_group_size=spec.awq_group_size or settings.awq_group_size,
        max_model_len=settings.max_model_len or spec.max_positions,
        max_num_seqs=settings.max_num_seqs or seqs,
        max_num_batched_tokens=settings.max_num_batched_tokens or batched,
        block_size=settings.block_size or (CPU_BLOCK_SIZE if gpu.is_cpu else GPU_BLOCK_SIZE),
        kv_space_gib=(settings.kv_space_gib or CPU_KV_SPACE_GIB) if gpu.is_cpu else None,
    )
