from __future__ import annotations

from pathlib import Path

import pytest

from loadtest.errors import LoadTestError
from loadtest.targets import Measured, Targets, evaluate, load_targets

GOOD = Measured(
    output_tokens_per_s=100,
    ttft_p50_ms=50,
    ttft_p99_ms=90,
    itl_p50_ms=10,
    itl_p99_ms=20,
    kv_cache_usage_max=0.5,
    preemptions=0,
    error_rate=0.0,
)


def test_builtin_targets_load() -> None:
    targets = load_targets("cpu-tiny")
    assert targets.min_output_tokens_per_s is not None and targets.max_preemptions == 0


def test_all_met_passes_and_one_miss_fails() -> None:
    targets = load_targets("cpu-tiny")
    assert evaluate(targets, GOOD).passed
    slow = Measured(**{**GOOD.__dict__, "itl_p99_ms": 5000.0})
    verdict = evaluate(targets, slow)
    assert not verdict.passed
    assert [c.name for c in verdict.checks if not c.passed] == ["ITL p99"]
    assert "MISS" in verdict.table() and "verdict: FAIL" in verdict.table()


def test_a_target_without_data_is_a_miss_and_unset_targets_are_skipped() -> None:
    targets = Targets(max_kv_cache_usage=0.9)
    verdict = evaluate(targets, Measured(**{**GOOD.__dict__, "kv_cache_usage_max": None}))
    assert [(c.name, c.measured, c.passed) for c in verdict.checks] == [
        ("KV cache usage (max)", "no data", False)
    ]


def test_goodput_targets_drop_the_throughput_floor() -> None:
    assert load_targets("cpu-tiny").latency_only().min_output_tokens_per_s is None


def test_bad_targets_name_the_field(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text("max_error_rate: 3\n")
    with pytest.raises(LoadTestError, match="field 'max_error_rate'"):
        load_targets(str(path))
    with pytest.raises(LoadTestError, match="no targets for profile 'nope'"):
        load_targets("nope")
