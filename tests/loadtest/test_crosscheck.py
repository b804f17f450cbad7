"""Cross-check verdicts: a disagreement always comes with a reason."""

from __future__ import annotations

from pathlib import Path

from loadtest.analysis import analyze
from loadtest.crosscheck import Comparison, reasons_for
from loadtest.targets import Targets
from tests.loadtest.records import run_data


def test_comparison_agrees_within_ten_percent() -> None:
    assert Comparison("x", 109.0, 100.0).agree
    assert not Comparison("x", 111.0, 100.0).agree
    assert Comparison("x", 1.0, 0.0).ratio == float("inf")


def test_small_ttft_gap_on_a_quiet_host_is_named(tmp_path: Path) -> None:
    report = analyze(
        run_data(tmp_path, failed=None), Targets(), meta={}
    )  # 50 ms TTFT, 20% CPU, no failures
    vllm = {"failed": 0}
    ttft = Comparison("mean TTFT (ms)", 32.7, 37.6)
    reasons = reasons_for(report, vllm, concurrency=1, num_prompts=10, differing=[ttft])
    assert len(reasons) == 1 and "4.9 ms per request" in reasons[0]


def test_unexplained_gap_is_stated_not_silent(tmp_path: Path) -> None:
    report = analyze(run_data(tmp_path, failed=None), Targets(), meta={})
    throughput = Comparison("output tokens/s", 500.0, 600.0)
    reasons = reasons_for(
        report, {"failed": 0}, concurrency=1, num_prompts=10, differing=[throughput]
    )
    assert len(reasons) == 1
    assert "no known cause" in reasons[0] and "ours 500.00 vs 600.00" in reasons[0]


def test_detected_causes_replace_the_fallback(tmp_path: Path) -> None:
    report = analyze(run_data(tmp_path, cpu_bound=True), Targets(), meta={})
    big_gap = Comparison("mean TTFT (ms)", 50.0, 80.0)
    reasons = reasons_for(report, {"failed": 2}, concurrency=4, num_prompts=10, differing=[big_gap])
    joined = " | ".join(reasons)
    assert "CPU-bound" in joined and "failed requests: ours 1, vllm 2" in joined
    assert "10x the concurrency" in joined and "no known cause" not in joined
    assert "per request" not in joined  # a 30 ms gap is not scheduling noise
