"""The gateway overhead benchmark runs end to end (`--quick`, no LiteLLM; the gateway with
the in-process and with the Redis quota store) and its results file holds sane numbers. Speed
is not asserted: that is what the benchmark reports; the Redis round trips per request are."""

from __future__ import annotations

import contextlib
import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from bench.gateway_overhead import report, table
from bench.gateway_overhead.__main__ import shown_command
from bench.gateway_overhead.load import Sample
from bench.gateway_overhead.profile import summarise
from bench.gateway_overhead.runner import JSON, LATENCY, STREAM
from bench.gateway_overhead.upstream import COMPLETION_TOKENS
from bench.results_files import latest

REPO = Path(__file__).resolve().parents[2]
PATHS = ("direct", "passthrough", "gateway", "gateway-redis")


def test_quick_run_writes_sane_results(tmp_path: Path) -> None:
    command = [
        *(sys.executable, "-m", "bench.gateway_overhead", "--quick"),
        *("--paths", "passthrough,gateway,gateway-redis", "--profile", "never"),
        *("--output-dir", str(tmp_path)),
    ]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]

    doc: dict[str, Any] = json.loads(latest(tmp_path / "gateway_overhead", ".json").read_text())
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

    # The Redis store: measured in the same rounds, with Redis's own command counters.
    redis_path = doc["paths"]["gateway-redis"]
    redis = redis_path["summary"]
    # One EVALSHA per request: the reservation, carrying the settles queued before it. The
    # last settles of a measurement go by themselves (or with the next measurement's first
    # reservation), and upkeep (renewals, reclaims) adds a little: around 1, not exactly.
    for per in ("req", "stream"):
        assert 0.95 <= redis[f"redis_evalsha_per_{per}"] <= 1.1, redis_path["redis_commands"]
        assert redis[f"redis_evalsha_per_{per}"] <= redis[f"redis_round_trips_per_{per}"] <= 1.2
    # Inside the scripts Redis runs many more (HINCRBY, TIME, ...): not round trips.
    assert redis["redis_commands_per_req"] > 5
    assert redis["redis_cpu_us_per_req"] > 0
    counted = redis_path["redis_commands"]
    assert counted["requests"] > 0 and counted["evalsha"] >= 0.95 * counted["requests"]
    assert counted["hincrby"] > 0 and counted["total"] > counted["round_trips"]
    first = redis_path["runs"]["json"][0]["redis_commands"]
    assert set(first) >= {"total", "round_trips", "evalsha"}
    assert "redis_commands" not in doc["paths"]["gateway"]
    in_process = doc["ratios"]["gateway-redis"]
    assert in_process["req_share_of_in_process"] > 0
    assert in_process["streams_share_of_in_process"] > 0
    assert math.isfinite(in_process["added_p50_ms_vs_in_process"])
    redis_targets = [t for t in doc["targets"] if t["target"].startswith("Redis store")]
    assert len(redis_targets) == 3
    assert all(t["verdict"] in {"pass", "MISS"} for t in redis_targets)
    pinning = doc["machine"]["pinning"]
    assert "redis-server on core" in pinning or pinning.startswith("not pinned")

    markdown = latest(tmp_path / "gateway_overhead").read_text()
    assert "| our gateway (serving gateway) |" in markdown
    assert "| our gateway, Redis quota store (--redis-url) |" in markdown
    assert "req/s vs passthrough" in markdown
    assert "Redis store vs in-process store (same gateway, same rounds):" in markdown
    assert "Redis round trips per request" in markdown
    # The usage read and the request object, timed on the upstream's own stream.
    pieces = doc["pieces"]
    assert 0 < pieces["final_usage_event_us"] < pieces["meter_one_event_per_read_us"]
    assert 0 < pieces["held_request_us"] < pieces["meter_lagging_reads_us"]
    assert "| usage read of one stream, one event per read |" in markdown


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


def _samples(per_second: float, *, cpu: float, commands: int = 0) -> dict[str, list[Sample]]:
    """Two runs of each metric: `per_second` requests in 1 s, each with `commands` Redis
    commands (one EVALSHA per request, the rest run inside it), `cpu` of a core for the proxy
    (and a tenth for Redis)."""

    def one(ok: int, latency_ms: float) -> Sample:
        sent = {"evalsha": ok, "hincrby": (commands - 1) * ok, "ping": 1} if commands else {}
        if commands:
            sent |= {"total": sum(sent.values()), "round_trips": ok + 1}
        share = {"proxy": cpu, "upstream": 0.3, "loadgen": 0.5, "machine": 1.5}
        if commands:
            share["redis"] = 0.1
        return Sample(
            seconds=1.0,
            ok=ok,
            errors=0,
            chunks=21 * ok,
            latencies_ms=[latency_ms] * 10,
            cpu_share=share,
            answered=ok,
            commands=sent,
        )

    n = int(per_second)
    slower = 0.2 if commands else 0.0  # ms a request with Redis takes longer
    return {
        LATENCY: [one(10, 1.0 + slower), one(10, 1.2 + slower)],
        JSON: [one(n, 1.0), one(n, 1.0)],
        STREAM: [one(n // 2, 1.0), one(n // 2, 1.0)],
    }


def test_redis_row_ratio_and_round_trips_in_the_results() -> None:
    in_process, redis = _samples(1000, cpu=0.9), _samples(800, cpu=0.95, commands=11)
    summaries = {"gateway": report.summarise(in_process), "gateway-redis": report.summarise(redis)}
    assert "redis_commands_per_req" not in summaries["gateway"]
    s = summaries["gateway-redis"]
    assert s["redis_evalsha_per_req"] == 1.0 and s["redis_round_trips_per_req"] == 1.00125
    assert s["redis_commands_per_req"] == 11.00125
    assert s["redis_cpu_us_per_req"] == 0.1 / 800 * 1e6

    ratios = report.ratios(summaries)
    r = ratios["gateway-redis"]
    assert r["req_share_of_in_process"] == 0.8 and r["streams_share_of_in_process"] == 0.8
    assert round(r["added_p50_ms_vs_in_process"], 6) == 0.2
    verdicts = [t["verdict"] for t in report.redis_targets(ratios, s["redis_round_trips_per_req"])]
    assert verdicts == ["pass", "pass", "pass"]
    below = report.redis_targets({"gateway-redis": {"req_share_of_in_process": 0.6}}, 2.0)
    assert [t["verdict"] for t in below] == ["MISS", "not measured", "MISS"]

    paths: dict[str, dict[str, Any]] = {
        name: {"label": name, "summary": summaries[name], "runs": {}}
        for name in ("gateway", "gateway-redis")
    }
    paths["gateway-redis"]["redis_commands"] = report.commands_by_name(redis)
    assert paths["gateway-redis"]["redis_commands"]["requests"] == 20 + 1600 + 800
    doc = {"paths": paths, "ratios": ratios}
    text = "\n".join(table.local_table(doc))
    assert "| gateway-redis |" in text
    assert "80% of the req/s, 80% of the streams/s, +0.20 ms p50" in text
    assert "one at a time. " in text and "1.001 at 32 concurrent (1.000 of them EVALSHA)" in text
    assert "2,426 round trips (evalsha 2,420, ping 6)" in text
    assert "24,200 more commands (hincrby 24,200), 11.0 per request" in text


def test_sigterm_stops_what_the_benchmark_started(tmp_path: Path) -> None:
    """`timeout` or a cancelled job sends SIGTERM: the benchmark ends as on Ctrl-C (130),
    and the upstream and gateway it started do not outlive it."""
    command = [
        *(sys.executable, "-m", "bench.gateway_overhead", "--quick", "--paths", "gateway"),
        *("--profile", "never", "--output-dir", str(tmp_path)),
    ]
    bench = subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    parent = psutil.Process(bench.pid)
    children: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 120
        while len(children := parent.children(recursive=True)) < 2:  # upstream and gateway
            assert time.monotonic() < deadline and bench.poll() is None, "nothing started"
            time.sleep(0.2)
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(timeout=60) == 130
        _, alive = psutil.wait_procs(children, timeout=10)
        assert alive == [], [child.pid for child in alive]
    finally:
        bench.kill()
        bench.wait()
        for child in children:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
