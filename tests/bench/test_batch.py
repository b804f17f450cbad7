"""The batch benchmark runs end to end on a real engine and its results file is sane.

`--quick` (tiny batch, one run) starts one cpu-tiny engine and one gateway with two keys, runs
the interactive key alone, a batch alone and both together. Speed is not asserted: that is
what the benchmark reports. What must hold: every batch line completed through the official
client, the interactive key was served alone and beside the batch without errors, the batch's
tokens match its lines, and the report carries the three measures and their verdicts.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.batch.__main__ import QUICK
from bench.results_files import latest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.engine
@pytest.mark.timeout(300)
def test_quick_batch_beside_interactive(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "bench.batch", "--quick", "--output-dir", str(tmp_path)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    doc: dict[str, Any] = json.loads(latest(tmp_path / "batch", ".json").read_text())
    assert doc["plan"]["batch_lines"] == QUICK["lines"]
    assert doc["machine"]["cpus"] >= 1 and len(doc["machine"]["loadavg_after"]) == 3
    assert len(doc["runs"]) == len(doc["ratios"]) == QUICK["runs"]
    for run, ratios in zip(doc["runs"], doc["ratios"], strict=True):
        for name in ("batch_alone", "both"):
            batch = run[name]
            assert (batch["status"], batch["lines_completed"], batch["lines_failed"]) == (
                "completed", QUICK["lines"], 0,
            )  # fmt: skip
            # vLLM's counter from the batch seen in progress to seen ended (polled), less
            # the interactive tokens: each line makes exactly its max_tokens (ignore_eos).
            # Never more than the lines made; less by what ran before the first poll saw it
            # and by interactive requests subtracted whole, at most half on this tiny batch.
            expected = QUICK["lines"] * QUICK["batch_max_tokens"]
            assert expected / 2 <= batch["batch_tokens"] <= expected
            assert batch["seconds"] > 0 and batch["tokens_per_s"] > 0
        for side in (run["alone"], run["both"]["interactive"]):
            assert side["n"] >= 1 and side["error_count"] == 0
            assert 0 < side["median_ms"] <= side["worst_ms"]
        assert all(math.isfinite(value) and value > 0 for value in ratios.values())
    text = latest(tmp_path / "batch").read_text()
    assert text.startswith("# Batch beside interactive load")
    for line in ("| TTFT median ms |", "| TTFT worst ms |", "| batch tokens/s |"):
        assert line in text
    assert text.count("runs, ") == 3
