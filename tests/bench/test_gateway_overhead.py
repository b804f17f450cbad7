"""The gateway overhead benchmark runs end to end (`--quick`, no LiteLLM) and its results
file holds sane numbers. Speed is not asserted: that is what the benchmark reports."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.gateway_overhead.__main__ import shown_command
from bench.gateway_overhead.load import Sample
from bench.gateway_overhead.profile import summarise
from bench.gateway_overhead.upstream import COMPLETION_TOKENS

REPO = Path(__file__).resolve().parents[2]
PATHS = ("direct", "passthrough", "gateway")


def test_quick_run_writes_sane_results(tmp_path: Path) -> None:
    command = [
        *(sys.executable, "-m", "bench.gateway_overhead", "--quick"),
        *("--paths", "passthrough,gateway", "--profile", "never", "--output-dir", str(tmp_path)),
    ]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]

    doc: dict[str, Any] = json.loads((tmp_path / "gateway_overhead.json").read_text())
    assert set(doc["paths"]) == set(PATHS)
    assert doc["skipped"] == {}
    for name in PATHS:
        summary = doc["paths"][name]["summary"]
        assert summary["errors"] == 0, doc["paths"][name]["runs"]
        assert 0 < summary["p50_ms"] <= summary["p99_ms"] < 1000
        assert summary["req_per_s"] > 0
        assert summary["streams_per_s"] > 0
        # Every stream: the deltas plus the usage chunk the client asked for.
        chunks_per_stream = summary["chunks_per_s"] / summary["streams_per_s"]
        assert COMPLETION_TOKENS - 0.01 <= chunks_per_stream <= COMPLETION_TOKENS + 1.01
        assert len(doc["paths"][name]["runs"]["json"]) == doc["plan"]["runs"]
    gateway = doc["ratios"]["gateway"]
    assert gateway["req_share_of_passthrough"] > 0
    assert math.isfinite(gateway["added_p50_ms"])
    verdicts = {t["target"]: t["verdict"] for t in doc["targets"]}
    assert set(verdicts.values()) <= {"pass", "MISS", "not measured"}
    assert any("LiteLLM" in target for target, v in verdicts.items() if v == "not measured")

    markdown = (tmp_path / "gateway_overhead.md").read_text()
    assert "| our gateway (serving gateway) |" in markdown
    assert "req/s vs passthrough" in markdown


def test_secrets_are_not_recorded() -> None:
    shown = shown_command(["--real-engine", "u", "--api-key", "sk-1", "--engine-api-key=sk-2"])
    assert "sk-1" not in shown and "sk-2" not in shown
    assert shown.endswith("--real-engine u --api-key *** --engine-api-key=***")


def test_percentile_is_nearest_rank() -> None:
    sample = Sample(seconds=1.0, ok=100, errors=0, latencies_ms=[float(i) for i in range(1, 101)])
    assert sample.percentile_ms(50) == 50.0
    assert sample.percentile_ms(99) == 99.0
    assert sample.per_second == 100.0


def test_profile_summary_groups_py_spy_stacks() -> None:
    raw = "\n".join(
        [
            "main (serving/cli.py:5);Runner.run (asyncio/runners.py:118) 6",
            "main (serving/cli.py:5);Runner.run (asyncio/runners.py:118);"
            "Proxy.forward (serving/gateway/proxy.py:90);"
            "ClientSession._request (aiohttp/client.py:900) 3",
            "main (serving/cli.py:5);Runner.run (asyncio/runners.py:118);"
            "Proxy.forward (serving/gateway/proxy.py:91) 1",
        ]
    )
    summary = summarise(raw)
    assert summary["samples"] == 10
    areas = {entry["name"]: entry["share"] for entry in summary["by_area"]}
    assert areas["aiohttp (upstream client)"] == 0.3
    assert areas["gateway code (serving/gateway)"] == 0.1
    inclusive = summary["inclusive"]
    assert inclusive == [{"name": "Proxy.forward (serving/gateway/proxy.py)", "share": 0.4}]
