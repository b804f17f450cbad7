"""A memory plan: what one replica holds per GPU, how many sequences fit, and a verdict.

    plan = plan_for(resolve_model("Qwen2.5-7B-Instruct"), get_gpu("rtx-4090"),
                    PlanSettings(tensor_parallel_size=4, max_model_len=32768))

GPU budget, as vLLM computes it: usable = total x gpu_memory_utilization; KV space = usable -
weights - LoRA buffers (with LoRA on, `planner/lora.py`) - activation peak (profiling,
estimated) - non-torch memory - CUDA graph memory (both estimated). On the CPU engine the KV
space is given (VLLM_CPU_KVCACHE_SPACE) and the weights and LoRA buffers live in host memory
outside it.

With pipeline parallelism every stage is planned on its own GPU (`stages`): the per-GPU
numbers of the plan are those of the stage with the least KV space, which binds the replica.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from serving.planner.activations import (
    CUDA_GRAPH_BYTES,
    activation_estimate,
    non_torch_bytes,
    with_vision_encoder,
)
from serving.planner.gpus import GiB, GpuSpec
from serving.planner.host_cpu import fp8_kv_warning
from serving.planner.kv import (
    CPU_KERNEL_BLOCK,
    GPU_KERNEL_BLOCK,
    KvCapacity,
    KvLayout,
    kv_capacity,
    kv_layout,
    sequence_fit,
)
from serving.planner.lora import LoraBytes, lora_bytes, unplanned
from serving.planner.models import ModelSpec
from serving.planner.precision import is_fp8, kv_dtype_bytes, model_dtype_bytes
from serving.planner.settings import PlanSettings, resolve
from serving.planner.stages import StageMemory, nodes_needed, pp_ranges, stage_spec
from serving.planner.suggest import candidate_changes
from serving.planner.weights import (
    WeightBytes,
    awq_shape_problem,
    bytes_read_per_token,
    param_count,
    weight_bytes,
)


@dataclass(frozen=True)
class Problem:
    """Why a plan does not fit: a short code and one line for people."""

    code: str  # context | awq_shape | weights | lora | memory | kv
    message: str


@dataclass(frozen=True)
class Suggestion:
    """The cheapest single change that makes a non-fitting plan fit."""

    change: str
    gpu: str
    settings: PlanSettings
    kv_tokens: int
    max_sequences: int


@dataclass(frozen=True)
class Plan:
    model: str
    gpu: GpuSpec
    settings: PlanSettings  # resolved: every default filled in
    parameters: int
    active_parameters: int  # used per token: differs from `parameters` for MoE models only
    replicas: int  # gpu_count // (tensor_parallel_size x pipeline_parallel_size)
    # per GPU of the binding stage (the only stage without pipeline parallelism), bytes
    usable_bytes: int  # total x utilization (CPU: the KV space)
    weights: WeightBytes
    activation_bytes: int  # estimate
    non_torch_bytes: int  # estimate
    cuda_graph_bytes: int  # estimate
    kv_available_bytes: int
    kv_bytes_per_token_model: int  # all full-attention layers, whole model, no replication
    layout: KvLayout
    capacity: KvCapacity
    max_sequences: int  # per replica, at max_model_len: min(max_num_seqs, what the blocks hold)
    headroom_bytes: int  # KV space left after one sequence of max_model_len
    decode_tokens_s: float | None  # one sequence, empty context (roofline)
    decode_tokens_s_full_context: float | None  # one sequence at max_model_len (roofline)
    problems: tuple[Problem, ...]
    suggestion: Suggestion | None = None
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()  # the plan fits, but something else will stop it
    stages: tuple[StageMemory, ...] = ()  # one per pipeline stage
    binding_stage: int = 0  # the stage with the fewest KV blocks
    # Per GPU of the binding stage; zero with LoRA off.
    lora: LoraBytes = field(default_factory=LoraBytes)

    @property
    def nodes(self) -> int:
        """Machines one replica spans (gpus_per_node GPUs each)."""
        s = self.settings
        world = s.tensor_parallel_size * s.pipeline_parallel_size
        return 1 if s.gpus_per_node is None else nodes_needed(world, s.gpus_per_node)

    @property
    def fits(self) -> bool:
        return not self.problems

    @property
    def binding(self) -> Problem | None:
        return self.problems[0] if self.problems else None


def _roofline(gpu: GpuSpec, read_bytes: int) -> float | None:
    bandwidth = gpu.bandwidth_bytes_s
    return None if bandwidth is None or read_bytes <= 0 else bandwidth / read_bytes


def _problems(plan: Plan, spec: ModelSpec) -> tuple[Problem, ...]:
    s = plan.settings
    assert s.max_model_len is not None
    found: list[Problem] = []
    if s.max_model_len > spec.max_positions:
        found.append(
            Problem(
                "context",
                f"max_model_len {s.max_model_len} exceeds the model's "
                f"max_position_embeddings {spec.max_positions}",
            )
        )
    if s.quantization == "awq":
        shape = awq_shape_problem(spec, s.tensor_parallel_size, s.awq_group_size)
        if shape:
            found.append(Problem("awq_shape", shape))
    lora = plan.lora.total
    if not plan.gpu.is_cpu:
        if plan.weights.total > plan.usable_bytes:
            found.append(
                Problem(
                    "weights",
                    f"weights need {plan.weights.total / GiB:.2f} GiB per GPU, "
                    f"{s.gpu_memory_utilization:g} x memory is {plan.usable_bytes / GiB:.2f} GiB",
                )
            )
        elif plan.weights.total + lora > plan.usable_bytes:
            found.append(Problem("lora", f"{_lora_buffers(plan)} do not fit beside the weights"))
        elif plan.kv_available_bytes <= 0:
            memory = "weights + activations + overheads leave no memory for the KV cache"
            if plan.kv_available_bytes + lora > 0:
                memory = f"{_lora_buffers(plan)} take the memory the KV cache would have had"
            found.append(Problem("memory", memory))
    need = plan.layout.bytes_per_sequence(s.max_model_len)
    if plan.kv_available_bytes > 0 and plan.kv_available_bytes < need:
        kv = (
            f"one sequence of {s.max_model_len} tokens needs {need / GiB:.2f} GiB of KV "
            f"cache per {'rank' if plan.gpu.is_cpu else 'GPU'}, "
            f"{plan.kv_available_bytes / GiB:.2f} GiB is available"
        )
        if not plan.gpu.is_cpu and plan.kv_available_bytes + lora >= need:
            kv += f": {_lora_buffers(plan)} take the rest"
        found.append(Problem("kv", kv))
    return tuple(found)


def _lora_buffers(plan: Plan) -> str:
    """'the LoRA buffers (max_loras 4 x rank 64: 1.23 GiB per GPU)', for problem messages."""
    s = plan.settings
    return (
        f"the LoRA buffers (max_loras {s.max_loras} x rank {s.max_lora_rank}: "
        f"{plan.lora.total / GiB:.2f} GiB per GPU)"
    )


def _notes(spec: ModelSpec, settings: PlanSettings) -> tuple[str, ...]:
    reason = unplanned(spec) if settings.enable_lora else None
    return (*spec.notes, *([reason] if reason else []))


def _warnings(gpu: GpuSpec, settings: PlanSettings) -> tuple[str, ...]:
    found: list[str] = []
    if gpu.is_cpu and is_fp8(settings.kv_cache_dtype):
        warning = fp8_kv_warning()
        found += [warning] if warning else []
    tp, per_node = settings.tensor_parallel_size, settings.gpus_per_node
    if not gpu.is_cpu and per_node is not None and tp > per_node:
        found.append(
            f"tensor parallelism {tp} crosses a node boundary ({per_node} GPUs per node): "
            "every layer's all-reduce then goes over the network; keep TP within a node "
            "and split across nodes with pipeline parallelism"
        )
    if gpu.is_cpu and settings.pipeline_parallel_size > 1:
        found.append(
            "pipeline parallelism fails in vLLM 0.32's CPU build (the second stage asserts "
            "`intermediate_tensors is not None`): on CPUs only tensor parallelism runs"
        )
    return tuple(found)


@dataclass(frozen=True)
class _Stage:
    part: ModelSpec  # the model as this stage holds it
    memory: StageMemory
    weights: WeightBytes
    layout: KvLayout
    capacity: KvCapacity
    lora: LoraBytes


def _stage(
    spec: ModelSpec, gpu: GpuSpec, s: PlanSettings, index: int, layers: tuple[int, int]
) -> _Stage:
    """One pipeline stage's GPU: its layers' weights and KV, its ends, what is left for KV."""
    assert s.max_model_len and s.max_num_seqs and s.max_num_batched_tokens and s.block_size
    tp, pp = s.tensor_parallel_size, s.pipeline_parallel_size
    first, last = index == 0, index == pp - 1
    part = stage_spec(spec, *layers)
    dtype_bytes = model_dtype_bytes(s.dtype, spec.dtype)
    awq = s.awq_group_size if s.quantization == "awq" else None
    pooling = s.runner == "pooling"
    weights = weight_bytes(
        part,
        tp,
        dtype_bytes=dtype_bytes,
        awq_group_size=awq,
        first_stage=first,
        last_stage=last,
        lm_head=not pooling,
    )
    lora = LoraBytes()
    if s.enable_lora:
        lora = lora_bytes(
            part,
            tp,
            max_loras=s.max_loras,
            max_lora_rank=s.max_lora_rank,
            dtype_bytes=dtype_bytes,
            first_stage=first,
            last_stage=last,
        )
    layout = kv_layout(
        part,
        tp,
        kv_dtype_bytes=kv_dtype_bytes(s.kv_cache_dtype, dtype_bytes),
        model_dtype_bytes=dtype_bytes,
        block_size=s.block_size,
        kernel_block=CPU_KERNEL_BLOCK if gpu.is_cpu else GPU_KERNEL_BLOCK,
        prefix_caching=s.prefix_caching,
    )
    activation = 0
    if gpu.is_cpu:
        assert s.kv_space_gib is not None
        available = int(s.kv_space_gib * GiB)
    else:
        estimate = activation_estimate(
            part,
            tp,
            dtype_bytes=dtype_bytes,
            max_num_batched_tokens=s.max_num_batched_tokens,
            max_num_seqs=s.max_num_seqs,
        )
        # Only the last stage samples (the logits of max_num_seqs rows); a pooling runner
        # samples nothing, and its pooler's pass (at most a hidden state per token, float32)
        # holds less than the forward pass.
        activation = estimate.peak_bytes if last and not pooling else estimate.forward_bytes
        if first:  # the vision encoder runs there
            activation = with_vision_encoder(activation, part, s, dtype_bytes=dtype_bytes)
        usable = math.ceil(gpu.memory_bytes * s.gpu_memory_utilization)
        graphs = 0 if s.enforce_eager else CUDA_GRAPH_BYTES
        # vLLM allocates the LoRA buffers with the model, before it measures what is left.
        available = (
            usable - weights.total - lora.total - activation - non_torch_bytes(tp * pp) - graphs
        )
    capacity = kv_capacity(layout, available, s.max_model_len)
    memory = StageMemory(
        index=index,
        first_layer=layers[0],
        last_layer=layers[1],
        weight_bytes=weights.total,
        activation_bytes=activation,
        kv_available_bytes=available,
        kv_blocks=capacity.num_blocks,
        lora_bytes=lora.total,
    )
    return _Stage(
        part=part, memory=memory, weights=weights, layout=layout, capacity=capacity, lora=lora
    )


def evaluate(spec: ModelSpec, gpu: GpuSpec, settings: PlanSettings) -> Plan:
    """The plan for exactly these settings (no suggestion)."""
    s = resolve(spec, gpu, settings)
    if s.language_model_only:
        spec = replace(spec, vision_params=0)
    assert s.max_model_len and s.max_num_seqs and s.gpu_count is not None
    tp, pp = s.tensor_parallel_size, s.pipeline_parallel_size
    dtype_bytes = model_dtype_bytes(s.dtype, spec.dtype)
    kv_bytes = kv_dtype_bytes(s.kv_cache_dtype, dtype_bytes)
    stages = [
        _stage(spec, gpu, s, index, layers)
        for index, layers in enumerate(pp_ranges(spec.layers, pp))
    ]
    # vLLM gives every stage the block count of the stage that holds the fewest.
    binding = min(stages, key=lambda stage: stage.capacity.num_blocks)
    weights, layout, capacity = binding.weights, binding.layout, binding.capacity
    available = binding.memory.kv_available_bytes
    if gpu.is_cpu:
        usable = available
        activation = overhead = graphs = 0
    else:
        usable = math.ceil(gpu.memory_bytes * s.gpu_memory_utilization)
        activation = binding.memory.activation_bytes
        overhead = non_torch_bytes(tp * pp)
        graphs = 0 if s.enforce_eager else CUDA_GRAPH_BYTES
    # One decode step runs the stages one after the other: it reads every stage's share.
    read = sum(bytes_read_per_token(stage.part, stage.weights) for stage in stages)
    full_context = sum(
        stage.layout.kv_bytes_per_token * s.max_model_len
        + stage.layout.state_bytes_per_layer * stage.part.linear_layers
        for stage in stages
    )
    plan = Plan(
        model=spec.name,
        gpu=gpu,
        settings=s,
        parameters=param_count(spec),
        active_parameters=param_count(spec, active=True),
        replicas=max(1, s.gpu_count // (tp * pp)),
        usable_bytes=usable,
        weights=weights,
        activation_bytes=activation,
        non_torch_bytes=overhead,
        cuda_graph_bytes=graphs,
        kv_available_bytes=available,
        kv_bytes_per_token_model=2
        * spec.full_attention_layers
        * spec.kv_heads
        * spec.head_dim
        * kv_bytes,
        layout=layout,
        capacity=capacity,
        # vLLM's max concurrency counts every block; its block pool keeps one (the null
        # block), so at an exact multiple one sequence fewer runs (the memory load test).
        max_sequences=min(
            s.max_num_seqs, sequence_fit(layout, capacity, s.max_model_len).sequences
        ),
        headroom_bytes=available - layout.bytes_per_sequence(s.max_model_len),
        decode_tokens_s=_roofline(gpu, read),
        decode_tokens_s_full_context=_roofline(gpu, read + full_context),
        problems=(),
        notes=_notes(spec, s),
        warnings=_warnings(gpu, s),
        stages=tuple(stage.memory for stage in stages),
        binding_stage=binding.memory.index,
        lora=binding.lora,
    )
    return replace(plan, problems=_problems(plan, spec))


def plan_for(spec: ModelSpec, gpu: GpuSpec, settings: PlanSettings) -> Plan:
    """The plan, and for a plan that does not fit, the cheapest change that makes it fit."""
    plan = evaluate(spec, gpu, settings)
    if plan.fits:
        return plan
    for change, new_gpu, new_settings in candidate_changes(spec, gpu, plan.settings):
        candidate = evaluate(spec, new_gpu, new_settings)
        if candidate.fits:
            suggestion = Suggestion(
                change=change,
                gpu=new_gpu.name,
                settings=candidate.settings,
                kv_tokens=candidate.capacity.tokens,
                max_sequences=candidate.max_sequences,
            )
            return replace(plan, suggestion=suggestion)
    return plan
