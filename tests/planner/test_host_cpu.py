"""fp8 KV cache on the CPU engine: the planner warns, and never suggests it, without AVX-512."""

from __future__ import annotations

from pathlib import Path

import pytest

from serving.planner import get_gpu, plan_for, resolve_model
from serving.planner import plan as plan_module
from serving.planner import suggest as suggest_module
from serving.planner.host_cpu import cpu_flags, fp8_kv_supported, fp8_kv_warning
from serving.planner.settings import PlanSettings

AVX2 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n\nprocessor\t: 1\nflags\t\t: fpu\n"
AVX512 = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512bw\n"
AMX = "processor\t: 0\nflags\t\t: fpu avx2 amx_bf16 amx_tile\n"


def cpuinfo(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cpuinfo"
    path.write_text(text)
    return path


def test_flags_of_the_first_processor(tmp_path: Path) -> None:
    assert cpu_flags(cpuinfo(tmp_path, AVX2)) == {"fpu", "sse2", "avx", "avx2", "fma"}
    assert cpu_flags(tmp_path / "missing") == frozenset()


@pytest.mark.parametrize(
    ("text", "supported"), [(AVX2, False), (AVX512, True), (AMX, True), ("processor: 0\n", None)]
)
def test_fp8_needs_avx512_or_amx(tmp_path: Path, text: str, supported: bool | None) -> None:
    path = cpuinfo(tmp_path, text)
    assert fp8_kv_supported(path) is supported
    warning = fp8_kv_warning(path)
    assert (warning is None) == bool(supported)
    if supported is False:
        assert warning is not None and "AVX2 only" in warning and "refuse to start" in warning


def test_cpu_plan_with_fp8_carries_the_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plan_module, "fp8_kv_warning", lambda: "needs AVX-512")
    settings = PlanSettings(max_model_len=4096, kv_space_gib=4, kv_cache_dtype="fp8")
    cpu = plan_for(resolve_model("Qwen3-8B"), get_gpu("cpu"), settings)
    assert cpu.fits and cpu.warnings == ("needs AVX-512",)
    gpu = plan_for(resolve_model("Qwen3-8B"), get_gpu("h100"), settings)
    assert gpu.warnings == ()  # GPUs have fp8 KV kernels
    auto = plan_for(
        resolve_model("Qwen3-8B"), get_gpu("cpu"), PlanSettings(max_model_len=4096, kv_space_gib=4)
    )
    assert auto.warnings == ()


@pytest.mark.parametrize("host_has_fp8", [False, True])
def test_cpu_suggestion_offers_fp8_only_where_it_runs(
    monkeypatch: pytest.MonkeyPatch, host_has_fp8: bool
) -> None:
    monkeypatch.setattr(suggest_module, "fp8_kv_supported", lambda: host_has_fp8)
    # 32K context of Qwen3-8B needs 4.5 GiB of bf16 KV: 4 GiB does not hold one sequence.
    settings = PlanSettings(max_model_len=32768, kv_space_gib=4)
    plan = plan_for(resolve_model("Qwen3-8B"), get_gpu("cpu"), settings)
    assert not plan.fits and plan.suggestion is not None
    assert (plan.suggestion.change == "--kv-cache-dtype fp8") == host_has_fp8
