"""Sweep and cross-check end to end against the fake upstream."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadtest.cli import main, parse_step_ramp
from loadtest.errors import LoadTestError
from loadtest.plan import parse_duration
from tests.loadtest.conftest import API_KEY
from tests.loadtest.fake_upstream import RunningFake


def test_durations_and_ramps_parse() -> None:
    assert [parse_duration(t) for t in ("90", "30s", "2m", "1m30s")] == [90, 30, 120, 90]
    with pytest.raises(LoadTestError, match=r"expected e\.g\. 30s"):
        parse_duration("soon")
    ramp = parse_step_ramp("1,2,10s,4")
    assert [ramp.users_at(t) for t in (0, 9.9, 10, 35, 40)] == [1, 1, 3, 7, None]


def test_sweep_reports_goodput(fake: RunningFake, tokenizer_dir: Path, tmp_path: Path) -> None:
    code = main(
        [
            "sweep",
            "--host",
            fake.url,
            "--api-key",
            API_KEY,
            "--tokenizer",
            str(tokenizer_dir),
            "--engine-metrics",
            f"{fake.url}/metrics",
            "--levels",
            "1,3",
            "--duration",
            "2s",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0
    sweep = json.loads((tmp_path / "sweep.json").read_text())
    assert sweep["goodput_users"] == 3
    assert [level["users"] for level in sweep["levels"]] == [1, 3]
    assert (tmp_path / "users-3" / "report.html").exists()
    assert "goodput: 3 users" in (tmp_path / "sweep.html").read_text()


def test_crosscheck_runs_interleaved_rounds_against_vllm_bench(
    fake: RunningFake, tokenizer_dir: Path, tmp_path: Path
) -> None:
    """vLLM's benchmark client (real runs of vllm.benchmarks.serve) and ours, same upstream.

    The plumbing: three rounds each, interleaved, each on a prompt set of its own, every
    request counted by both, CPU charged to both, medians and spreads in the verdict. The
    fake's timing is fixed (30 ms to the first token, then 5 ms a token), so the medians sit
    close; how close the two clients are on the real engine is tests/integration's claim.
    """
    code = main(
        [
            "crosscheck",
            "--host",
            fake.url,
            "--api-key",
            API_KEY,
            "--tokenizer",
            str(tokenizer_dir),
            "--engine-metrics",
            f"{fake.url}/metrics",
            "--concurrency",
            "4",
            "--num-prompts",
            "40",
            "--rounds",
            "3",
            "--out",
            str(tmp_path),
        ]
    )
    result = json.loads((tmp_path / "crosscheck.json").read_text())
    rounds = result["round_results"]
    assert [r["client"] for r in rounds] == ["ours", "vllm", "vllm", "ours", "ours", "vllm"]
    assert all(r["completed"] == 40 and r["failed"] == 0 for r in rounds), rounds
    assert all(r["cpu_ms_per_request"] and r["cpu_ms_per_request"] > 0 for r in rounds)
    prompts = [(tmp_path / f"round-{i:02d}-{r['client']}" / "prompts.jsonl").read_text()
               for i, r in enumerate(rounds, start=1)]  # fmt: skip
    assert len(set(prompts)) == 6  # no round repeats another's prompts
    comparisons = {c["metric"]: c for c in result["comparisons"]}
    assert [m for m, c in comparisons.items() if c["judged"]] == [
        "output tokens/s",
        "mean TTFT (ms)",
    ]
    throughput, ttft = comparisons["output tokens/s"], comparisons["mean TTFT (ms)"]
    if not result["noisy"]:
        # Quiet rounds: the same throughput within 10%. TTFT: both at least the fake's 30 ms and
        # within 10 ms of each other. Against a 30 ms first token, each client's own time before
        # its request leaves is more than 10% (measured on the 2-core machine: ours +4.5 ms,
        # vLLM's +9 ms), so the verdict may be DIFFER here; the real engine's first token takes
        # ten times longer, and there the 10% is held (tests/integration/test_loadtest.py).
        assert abs(throughput["ratio"] - 1) <= 0.10, comparisons
        medians = (ttft["ours"]["median"], ttft["vllm"]["median"])
        assert min(medians) >= 30 and abs(medians[0] - medians[1]) < 10, comparisons
    # Rounds the busy machine upset: only what no stall can move this far.
    assert 0.67 < throughput["ratio"] < 1.5 and 0.5 < ttft["ratio"] < 2.0, comparisons
    assert code == (3 if result["noisy"] else 0 if result["agree"] else 1)
    assert (result["agree"] and not result["noisy"]) or result["reasons"]
