"""What this host's CPU can do, where vLLM's CPU engine depends on it.

vLLM's CPU build lists fp8 KV-cache dtypes, but its fp8 attention kernels exist only for
AVX-512 and AMX; on an AVX2-only CPU the engine refuses to start with an fp8 cache. The CPU
"device" in a plan is this host, so the planner can say so before anything starts.

Usage: `if not fp8_kv_supported(): ...`; `cpu_flags(Path("/proc/cpuinfo"))` in tests.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from serving.vllm_flags import engine_flag

CPUINFO = Path("/proc/cpuinfo")
FP8_KV_FLAGS = ("avx512f", "amx_bf16", "amx_tile")


@cache  # read once per process: a suggestion search evaluates many plans
def cpu_flags(cpuinfo: Path = CPUINFO) -> frozenset[str]:
    """The first processor's feature flags; empty where /proc/cpuinfo cannot be read."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def fp8_kv_supported(cpuinfo: Path = CPUINFO) -> bool | None:
    """True/False for this host; None where the flags cannot be read (not Linux)."""
    flags = cpu_flags(cpuinfo)
    if not flags:
        return None
    return any(flag in flags for flag in FP8_KV_FLAGS)


def fp8_kv_warning(cpuinfo: Path = CPUINFO) -> str | None:
    """The planner's warning for an fp8 KV cache on this host's CPU engine, if it needs one."""
    supported = fp8_kv_supported(cpuinfo)
    if supported:
        return None
    if supported is None:
        return (
            "fp8 KV cache on vLLM's CPU engine needs AVX-512 or AMX; this host's CPU flags "
            "could not be read"
        )
    return (
        "fp8 KV cache on vLLM's CPU engine needs AVX-512 or AMX; this CPU has neither "
        f"(AVX2 only), so vLLM will refuse to start: use {engine_flag('kv_cache_dtype')} auto here"
    )
