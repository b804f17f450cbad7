"""Single changes to try on a plan that does not fit, cheapest first.

Order: fp8 KV cache (free, small quality cost), one LoRA adapter per batch (when LoRA is on
with several), a shorter max_model_len, AWQ int4 weights,
more tensor parallelism (next powers of two that divide the heads; within one node when the
plan names its GPUs per node), more pipeline stages (more nodes), a bigger GPU. On the CPU
engine a bigger VLLM_CPU_KVCACHE_SPACE replaces the bigger GPU. `plan.plan_for` evaluates
them in this order and reports the first that fits.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import replace

from serving.errors import ServingError
from serving.planner.gpus import GpuSpec, larger_gpus
from serving.planner.host_cpu import fp8_kv_supported
from serving.planner.models import ModelSpec
from serving.planner.precision import is_fp8
from serving.planner.settings import PlanSettings, resolve
from serving.vllm_flags import engine_flag

Change = tuple[str, GpuSpec, PlanSettings]
MIN_CONTEXT = 1024
MAX_TP = 16
MAX_PP = 8


def _shorter_contexts(spec: ModelSpec, current: int) -> list[int]:
    lengths = {2**k for k in range(10, 22) if MIN_CONTEXT <= 2**k < current}
    if spec.max_positions < current:
        lengths.add(spec.max_positions)
    return sorted(lengths, reverse=True)


def _valid(spec: ModelSpec, gpu: GpuSpec, settings: PlanSettings) -> bool:
    try:
        resolve(spec, gpu, settings)
    except ServingError:
        return False
    return True


def candidate_changes(spec: ModelSpec, gpu: GpuSpec, settings: PlanSettings) -> Iterator[Change]:
    """(description, gpu, settings) for each single change, cheapest first."""
    # On this host's CPU fp8 needs AVX-512/AMX: never suggest a change vLLM would refuse.
    fp8_runs = not gpu.is_cpu or fp8_kv_supported() is True
    if not is_fp8(settings.kv_cache_dtype) and fp8_runs:
        change = f"{engine_flag('kv_cache_dtype')} fp8"
        yield change, gpu, replace(settings, kv_cache_dtype="fp8")
    if settings.enable_lora and settings.max_loras > 1:
        # Fewer adapters in one batch: the LoRA buffers shrink in proportion.
        yield f"{engine_flag('max_loras')} 1", gpu, replace(settings, max_loras=1)
    current = settings.max_model_len or spec.max_positions
    for length in _shorter_contexts(spec, current):
        change = f"{engine_flag('max_model_len')} {length}"
        yield change, gpu, replace(settings, max_model_len=length)
    if settings.quantization == "none" and not gpu.is_cpu:
        yield f"{engine_flag('quantization')} awq", gpu, replace(settings, quantization="awq")
    tp, pp = settings.tensor_parallel_size, settings.pipeline_parallel_size
    gpus = settings.gpu_count or tp * pp
    # A plan on one machine grows that machine; one that names its GPUs per node keeps TP
    # within a node and grows across nodes with pipeline stages.
    per_node = settings.gpus_per_node
    more = [2**k for k in range(1, 5) if tp < 2**k <= min(MAX_TP, per_node or MAX_TP)]
    for new_tp in more:
        count = max(gpus, new_tp * pp)
        changed = replace(settings, tensor_parallel_size=new_tp, gpu_count=count)
        if _valid(spec, gpu, changed):
            yield f"--tp {new_tp} --gpus {count}", gpu, changed
    if not gpu.is_cpu:  # vLLM 0.32's CPU build cannot run pipeline parallelism
        for new_pp in (2**k for k in range(1, 4) if pp < 2**k <= MAX_PP):
            count = max(gpus, tp * new_pp)
            changed = replace(settings, pipeline_parallel_size=new_pp, gpu_count=count)
            if _valid(spec, gpu, changed):
                yield f"--pp {new_pp} --gpus {count}", gpu, changed
    if gpu.is_cpu:
        space = settings.kv_space_gib or 0.0
        for factor in (2, 4, 8):
            gib = float(math.ceil(space * factor))
            yield f"--kv-space-gib {gib:g}", gpu, replace(settings, kv_space_gib=gib)
        return
    for bigger in larger_gpus(gpu):
        yield f"--gpu {bigger.name}", bigger, settings
