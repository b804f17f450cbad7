"""`serving plan`: will this model fit on these GPUs, at what context, with how many sequences.

    serving plan --model Qwen2.5-7B-Instruct --gpu rtx-4090 --gpus 4 --tp 4
    serving plan --profile qwen3.5-9b-128k-tp4 --json
    serving plan --model Qwen2.5-72B-Instruct --gpus 8 --gpus-per-node 4 --tp 4 --pp 2

Flags override the values of a `--profile`; the engine settings take vLLM's flag names (from
`serving.vllm_flags`, so the cheapest change reads as vLLM would take it). Pure arithmetic:
no torch, no vLLM.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from serving.errors import ServingError
from serving.planner.catalog import names_awq, resolve_model
from serving.planner.gpus import get_gpu, with_memory
from serving.planner.plan import plan_for
from serving.planner.profile_plan import (
    DEFAULT_GPU,
    default_gpu,
    profile_gpu,
    profile_model_ref,
    profile_settings,
)
from serving.planner.render import plan_to_dict, render_table
from serving.planner.settings import RUNNERS, PlanSettings
from serving.vllm_flags import DEFAULT_GPU_MEMORY_UTILIZATION, engine_flag

if TYPE_CHECKING:
    from serving.profiles.model import Profile


def _engine_argument(parser: argparse.ArgumentParser, name: str, **kwargs: Any) -> None:
    """A flag for the PlanSettings field `name`, spelled as vLLM spells it."""
    parser.add_argument(engine_flag(name), dest=name, **kwargs)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile", help="profile name or YAML path to plan (flags override it)")
    parser.add_argument(
        "--model", help="catalog name (Qwen2.5-7B-Instruct, ...) or a directory with config.json"
    )
    parser.add_argument(
        "--gpu", help=f"GPU type (default {DEFAULT_GPU}); `cpu` for vLLM's CPU engine"
    )
    parser.add_argument("--gpus", type=int, help="number of GPUs, all nodes (default: tp x pp)")
    parser.add_argument(
        "--gpus-per-node", type=int, help="GPUs in one machine (default: all on one machine)"
    )
    parser.add_argument(
        "--gpu-memory-gib",
        type=float,
        help="total GPU memory as vLLM reports it (overrides the GPU table)",
    )
    parser.add_argument("--tp", type=int, help="tensor parallel size (default 1)")
    parser.add_argument(
        "--pp", type=int, help="pipeline parallel size: stages of tp GPUs each (default 1)"
    )
    _engine_argument(parser, "dtype", help="auto, float16, bfloat16 (default auto)")
    _engine_argument(parser, "quantization", help="none or awq (default none)")
    _engine_argument(
        parser, "kv_cache_dtype", help="auto, float16, bfloat16, fp8, fp8_e4m3, fp8_e5m2"
    )
    _engine_argument(
        parser, "max_model_len", type=int, help="context length (default: the model's)"
    )
    _engine_argument(
        parser,
        "gpu_memory_utilization",
        type=float,
        help=f"fraction (default {DEFAULT_GPU_MEMORY_UTILIZATION})",
    )
    _engine_argument(parser, "max_num_seqs", type=int, help="default: vLLM's for the device")
    _engine_argument(
        parser, "max_num_batched_tokens", type=int, help="default: vLLM's for the device"
    )
    parser.add_argument("--kv-space-gib", type=float, help="CPU engine KV space (default 4)")
    _engine_argument(parser, "block_size", type=int, help="KV block size (default 16 GPU, 128 CPU)")
    parser.add_argument(
        "--no-prefix-caching",
        action="store_true",
        help="plan with prefix caching off (hybrid models keep fewer states)",
    )
    language_model_only = engine_flag("language_model_only")
    _engine_argument(
        parser,
        "language_model_only",
        action="store_true",
        help=f"plan without the vision encoder (vLLM {language_model_only})",
    )
    _engine_argument(
        parser,
        "runner",
        choices=RUNNERS,
        help="pooling: an embedding or scoring model, no LM head, no sampler (default generate)",
    )
    _engine_argument(
        parser, "enable_lora", action="store_true", help="plan vLLM's LoRA adapter buffers"
    )
    _engine_argument(
        parser, "max_loras", type=int, help="LoRA adapters in one batch (implies LoRA on)"
    )
    _engine_argument(parser, "max_lora_rank", type=int, help="largest LoRA rank (implies LoRA on)")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")


def _load_profile(name: str) -> Profile:
    from serving.profiles import load_profile  # the profiles package needs pydantic and YAML

    return load_profile(name)


def _with_flags(settings: PlanSettings, args: argparse.Namespace) -> PlanSettings:
    overrides = {
        "tensor_parallel_size": args.tp,
        "pipeline_parallel_size": args.pp,
        "gpu_count": args.gpus,
        "gpus_per_node": args.gpus_per_node,
        "dtype": args.dtype,
        "quantization": args.quantization,
        "kv_cache_dtype": args.kv_cache_dtype,
        "max_model_len": args.max_model_len,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "kv_space_gib": args.kv_space_gib,
        "block_size": args.block_size,
        "prefix_caching": False if args.no_prefix_caching else None,
        "language_model_only": True if args.language_model_only else None,
        "max_loras": args.max_loras,
        "max_lora_rank": args.max_lora_rank,
        "runner": args.runner,
    }
    lora_flags = args.enable_lora or args.max_loras is not None or args.max_lora_rank is not None
    overrides["enable_lora"] = True if lora_flags else None
    changed = {key: value for key, value in overrides.items() if value is not None}
    return replace(settings, **changed)


def run(args: argparse.Namespace) -> int:
    profile = _load_profile(args.profile) if args.profile else None
    settings = PlanSettings() if profile is None else profile_settings(profile)
    model_ref = args.model
    if model_ref is None and profile is not None:
        model_ref = profile_model_ref(profile)
    if not model_ref:
        raise ServingError("--model: required (a catalog name or a directory), or give --profile")
    spec = resolve_model(model_ref)
    if args.quantization is None and settings.quantization == "none" and names_awq(model_ref):
        settings = replace(settings, quantization="awq")
    settings = _with_flags(settings, args)
    gpu = get_gpu(args.gpu) if args.gpu else (profile_gpu(profile) if profile else default_gpu())
    if args.gpu_memory_gib is not None:
        gpu = with_memory(gpu, args.gpu_memory_gib)
    plan = plan_for(spec, gpu, settings)
    if args.json:
        print(json.dumps(plan_to_dict(plan), indent=2))
    else:
        print(render_table(plan))
    return 0
