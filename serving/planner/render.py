"""A plan as a terminal table (for people) or a JSON object (for tools)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from serving.planner.gpus import GiB
from serving.planner.plan import Plan
from serving.planner.settings import PlanSettings
from serving.planner.stages import nodes_needed

KiB = 1024


def _gib(value: int) -> str:
    text = f"{value / GiB:8.2f}"
    # A model of a few MB (the embedded tiny one) would read 0.00: show its size too.
    return f"{text}  ({value / 2**20:.1f} MiB)" if 0 < value < GiB // 100 else text


def _parameters(count: int) -> str:
    return f"{count / 1e9:.2f} B" if count >= 10**8 else f"{count / 1e6:.2f} M"


def _tokens_s(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f} tok/s"


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    """Every number of the plan, in bytes and tokens (stable keys for tools)."""
    s = plan.settings
    assert s.max_model_len is not None
    suggestion = None
    if plan.suggestion is not None:
        suggestion = {
            "change": plan.suggestion.change,
            "gpu": plan.suggestion.gpu,
            "kv_cache_tokens": plan.suggestion.kv_tokens,
            "max_sequences": plan.suggestion.max_sequences,
            "settings": asdict(plan.suggestion.settings),
        }
    return {
        "model": plan.model,
        "parameters": plan.parameters,
        "active_parameters": plan.active_parameters,
        "gpu": {
            "name": plan.gpu.name,
            "label": plan.gpu.label,
            "memory_bytes": plan.gpu.memory_bytes,
            "bandwidth_gb_s": plan.gpu.bandwidth_gb_s,
        },
        "settings": asdict(s),
        "replicas": plan.replicas,
        "nodes": plan.nodes,
        "binding_stage": plan.binding_stage,
        "stages": [
            {
                "layers": [stage.first_layer, stage.last_layer],
                "weight_bytes": stage.weight_bytes,
                "activation_bytes_estimate": stage.activation_bytes,
                "kv_cache_bytes": stage.kv_available_bytes,
                "num_blocks": stage.kv_blocks,
                "lora_bytes": stage.lora_bytes,
            }
            for stage in plan.stages
        ],
        "per_gpu": {
            "usable_bytes": plan.usable_bytes,
            "weight_bytes": plan.weights.total,
            "weights": asdict(plan.weights),
            "lora_bytes": plan.lora.total,
            "lora": asdict(plan.lora),
            "activation_bytes_estimate": plan.activation_bytes,
            "non_torch_bytes_estimate": plan.non_torch_bytes,
            "cuda_graph_bytes_estimate": plan.cuda_graph_bytes,
            "kv_cache_bytes": plan.kv_available_bytes,
        },
        "kv": {
            "bytes_per_token_model": plan.kv_bytes_per_token_model,
            "bytes_per_token_per_gpu": plan.layout.kv_bytes_per_token,
            "block_size": plan.layout.block_size,
            "bytes_per_block": plan.layout.bytes_per_block,
            "linear_state_bytes_per_layer": plan.layout.state_bytes_per_layer,
            "state_bytes_per_sequence": plan.layout.state_bytes_per_sequence,
            "num_blocks": plan.capacity.num_blocks,
            "capacity_tokens": plan.capacity.tokens,
            "max_concurrency": plan.capacity.max_concurrency,
            "bytes_per_sequence": plan.layout.bytes_per_sequence(s.max_model_len),
        },
        "max_sequences_at_full_context": plan.max_sequences,
        "headroom_bytes": plan.headroom_bytes,
        "decode_tokens_per_s": plan.decode_tokens_s,
        "decode_tokens_per_s_full_context": plan.decode_tokens_s_full_context,
        "fits": plan.fits,
        "binding": plan.binding.code if plan.binding else None,
        "problems": [asdict(problem) for problem in plan.problems],
        "suggestion": suggestion,
        "notes": list(plan.notes),
        "warnings": list(plan.warnings),
    }


def _header(plan: Plan) -> list[str]:
    s = plan.settings
    precision = "AWQ int4" if s.quantization == "awq" else "no quantization"
    replicas = "" if plan.replicas == 1 else f", {plan.replicas} replicas"
    count = "" if plan.gpu.is_cpu else f"{s.gpu_count} x "
    pp = s.pipeline_parallel_size
    stages = "" if pp == 1 else f", pp={pp}"
    active = ""
    if plan.active_parameters != plan.parameters:
        active = f", {_parameters(plan.active_parameters)} active per token"
    size = f"{_parameters(plan.parameters)} parameters{active}"
    lines = [
        f"{plan.model} ({size}) on {count}{plan.gpu.label}",
        f"  tp={s.tensor_parallel_size}{stages}{replicas}, dtype {s.dtype}, {precision}, "
        f"KV cache dtype {s.kv_cache_dtype}",
        f"  max_model_len {s.max_model_len}, max_num_seqs {s.max_num_seqs}, "
        f"max_num_batched_tokens {s.max_num_batched_tokens}",
    ]
    if plan.nodes > 1:
        world = s.tensor_parallel_size * pp
        lines.append(
            f"  one replica spans {plan.nodes} nodes: {world} {_unit(plan)}s, "
            f"{s.gpus_per_node} per node (vLLM on a Ray cluster)"
        )
    return lines


def _stages(plan: Plan) -> list[str]:
    """Per-stage memory, when the layers are split over pipeline stages."""
    if len(plan.stages) < 2:
        return []
    unit = _unit(plan)
    lines = ["", f"Pipeline stages (per {unit}; vLLM gives every stage the fewest blocks)"]
    for stage in plan.stages:
        ends = ("embedding, " if stage.index == 0 else "") + (
            "LM head, " if stage.index == len(plan.stages) - 1 else ""
        )
        mark = "  <- binds" if stage.index == plan.binding_stage else ""
        lines.append(
            f"  stage {stage.index}: layers {stage.first_layer}-{stage.last_layer - 1} "
            f"({stage.layers}, {ends}weights {stage.weight_bytes / GiB:.2f} GiB), "
            f"KV {stage.kv_available_bytes / GiB:.2f} GiB, {stage.kv_blocks:,} blocks{mark}"
        )
    return lines


def _sequences(count: int) -> str:
    return f"{count} sequence" if count == 1 else f"{count} sequences"


def _unit(plan: Plan) -> str:
    return "rank" if plan.gpu.is_cpu else "GPU"


def _row(label: str, value: str) -> str:
    return f"  {label:<42}{value}"


def _lora(plan: Plan, where: str) -> list[str]:
    """The LoRA buffers' row, when LoRA is on."""
    s = plan.settings
    if not s.enable_lora:
        return []
    label = f"LoRA buffers ({s.max_loras} x rank {s.max_lora_rank}{where})"
    return [_row(label, _gib(plan.lora.total))]


def _memory(plan: Plan) -> list[str]:
    s = plan.settings
    if plan.gpu.is_cpu:
        return [
            "",
            _row("Per rank (host memory)", "     GiB"),
            _row("weights (outside the KV space)", _gib(plan.weights.total)),
            *_lora(plan, ", outside it"),
            _row("KV cache space (VLLM_CPU_KVCACHE_SPACE)", _gib(plan.kv_available_bytes)),
        ]
    return [
        "",
        _row(
            "Per GPU" + (f" (stage {plan.binding_stage})" if len(plan.stages) > 1 else ""),
            "     GiB",
        ),
        _row("memory seen by CUDA", _gib(plan.gpu.memory_bytes)),
        _row(f"usable (x {s.gpu_memory_utilization:g})", _gib(plan.usable_bytes)),
        _row("weights", _gib(plan.weights.total)),
        *_lora(plan, ""),
        _row("activation peak (estimate)", _gib(plan.activation_bytes)),
        _row("non-torch memory (estimate)", _gib(plan.non_torch_bytes)),
        _row("CUDA graphs (estimate)", _gib(plan.cuda_graph_bytes)),
        _row("KV cache space", _gib(plan.kv_available_bytes)),
    ]


def _kv(plan: Plan) -> list[str]:
    layout, capacity, s = plan.layout, plan.capacity, plan.settings
    unit = _unit(plan)
    per_token = (
        f"{plan.kv_bytes_per_token_model / KiB:,.1f} KiB / "
        f"{layout.kv_bytes_per_token / KiB:,.1f} KiB"
    )
    lines = [
        "",
        "KV cache",
        _row(f"per token, whole model / per {unit}", per_token),
        _row(
            "block",
            f"{layout.block_size} tokens, {layout.bytes_per_block / KiB:,.1f} KiB per {unit}",
        ),
    ]
    if layout.state_groups:
        state = (
            f"{layout.state_bytes_per_sequence / KiB:,.0f} KiB per {unit} "
            f"({layout.state_groups} groups x {layout.state_blocks_per_group} blocks)"
        )
        lines.append(_row("linear-attention state per sequence", state))
    lines += [
        _row("blocks", f"{capacity.num_blocks:,}"),
        _row("capacity (vLLM: KV cache size)", f"{capacity.tokens:,} tokens"),
        _row(f"max concurrency at {s.max_model_len} tokens", f"{capacity.max_concurrency:,.2f}x"),
        _row(
            "sequences at full context",
            f"{plan.max_sequences} per replica (max_num_seqs {s.max_num_seqs})",
        ),
    ]
    return lines


def _nodes(settings: PlanSettings) -> str:
    """' (2 nodes of 4 GPUs)' for settings that need more than one machine, else ''."""
    per_node = settings.gpus_per_node
    world = settings.tensor_parallel_size * settings.pipeline_parallel_size
    if per_node is None or world <= per_node:
        return ""
    return f" ({nodes_needed(world, per_node)} nodes of {per_node} GPUs)"


def _verdict(plan: Plan) -> list[str]:
    lines = [
        "",
        f"Decode roofline, one sequence: {_tokens_s(plan.decode_tokens_s)} (empty context), "
        f"{_tokens_s(plan.decode_tokens_s_full_context)} (full context)",
    ]
    if plan.fits:
        headroom = f"{plan.headroom_bytes / GiB:.2f} GiB KV headroom per {_unit(plan)}"
        lines.append(f"Verdict: FITS ({headroom} beyond one full-length sequence)")
    else:
        lines.append("Verdict: DOES NOT FIT")
        lines += [f"  {problem.code}: {problem.message}" for problem in plan.problems]
        if plan.suggestion is None:
            lines.append("Cheapest change: no single change makes it fit")
        else:
            sug = plan.suggestion
            lines.append(
                f"Cheapest change: {sug.change}{_nodes(sug.settings)} -> {sug.kv_tokens:,} KV "
                f"tokens, {_sequences(sug.max_sequences)} at full context"
            )
    lines += [f"Warning: {warning}" for warning in plan.warnings]
    lines += [f"Note: {note}" for note in plan.notes]
    return lines


def render_table(plan: Plan) -> str:
    return "\n".join(_header(plan) + _memory(plan) + _stages(plan) + _kv(plan) + _verdict(plan))
