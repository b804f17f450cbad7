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


def test_crosscheck_agrees_with_vllm_bench(
    fake: RunningFake, tokenizer_dir: Path, tmp_path: Path
) -> None:
    """vLLM's benchmark client (a real run of vllm.benchmarks.serve) and ours, same upstream.

    The fake shares two cores with both clients here, so a few ms of scheduling noise on a
    30 ms TTFT can exceed 10%: the test asks for the same work, a loose agreement, and an
    explanation whenever the 10% verdict fails. The 10% claim is made on the real engine.
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
            "--concurrency",
            "4",
            "--num-prompts",
            "40",
            "--out",
            str(tmp_path),
        ]
    )
    result = json.loads((tmp_path / "crosscheck.json").read_text())
    assert result["vllm"]["completed"] == 40 and result["ours"]["succeeded"] == 40
    assert result["vllm"]["total_output_tokens"] == result["ours"]["output_tokens"] == 40 * 32
    ratios = {c["metric"]: c["ratio"] for c in result["comparisons"]}
    assert 0.7 < ratios["output tokens/s"] < 1.3, ratios
    # A 30 ms TTFT moves by several ms when the two cores are busy; a client that measured
    # something else (say, the end of the response: 190 ms here) would be far outside this.
    assert 0.5 < ratios["mean TTFT (ms)"] < 2.0, ratios
    assert 0.5 < ratios["mean TPOT (ms)"] < 2.0, ratios
    assert code == (0 if result["agree"] else 1)
    assert result["agree"] or result["reasons"]
