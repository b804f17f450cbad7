"""A few seconds of real Locust load through the gateway onto the real engine.

The run sends a fixed number of requests that all complete, so the token counts Locust's
users record from the usage chunks must equal the increase of vLLM's own counters.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

from loadtest.cli import main
from loadtest.crosscheck_verdict import FLOORS
from loadtest.scraper import GENERATION_TOKENS, PROMPT_TOKENS, parse_metrics
from tests.integration.conftest import Stack, serving_env

REQUESTS = 8


def engine_counters(stack: Stack) -> dict[str, float]:
    with urllib.request.urlopen(f"{stack.engine_url}/metrics", timeout=10) as response:
        values = parse_metrics(response.read().decode())
    return {name: values.get(name, 0.0) for name in (PROMPT_TOKENS, GENERATION_TOKENS)}


def settled_counters(stack: Stack, before: dict[str, float], want: float) -> dict[str, float]:
    """vLLM updates its counters as its steps finish: wait until the output count is in."""
    deadline = time.monotonic() + 15
    while True:
        now = engine_counters(stack)
        if (
            now[GENERATION_TOKENS] - before[GENERATION_TOKENS] >= want
            or time.monotonic() > deadline
        ):
            return now
        time.sleep(0.5)


def test_locust_run_through_the_gateway_matches_the_engine_counters(
    stack: Stack, tmp_path: Path
) -> None:
    tokenizer = Path(serving_env()["SERVING_HOME"]) / "models" / "qwen3-tiny"
    targets = tmp_path / "targets.yaml"
    targets.write_text("max_error_rate: 0\n")
    before = engine_counters(stack)
    code = main([
        "run", "--host", stack.gateway_url, "--api-key", stack.api_key,
        "--engine-metrics", f"{stack.engine_url}/metrics",
        "--workload", "short-chat", "--tokenizer", str(tokenizer), "--targets", str(targets),
        "--users", "2", "--max-requests", str(REQUESTS), "--duration", "300s",
        "--scrape-interval", "0.5", "--out", str(tmp_path / "run"),
    ])  # fmt: skip
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    summary = report["summary"]
    assert code == 0, summary["errors"]
    assert summary["succeeded"] == REQUESTS and summary["failed"] == 0
    assert summary["output_tokens"] == REQUESTS * 32  # short-chat: 32 tokens, ignore_eos
    after = settled_counters(stack, before, summary["output_tokens"])
    assert summary["output_tokens"] == after[GENERATION_TOKENS] - before[GENERATION_TOKENS]
    assert summary["prompt_tokens"] == after[PROMPT_TOKENS] - before[PROMPT_TOKENS]
    # Sized in the model's own tokens (a BPE merge at a window's edge may shift one or two).
    assert abs(summary["prompt_tokens"] - REQUESTS * 64) <= 2 * REQUESTS
    # Sane timings: positive, ordered, and the report saw the engine working: a counter's
    # increase between the first scrape (before Locust starts) and the last (after it
    # ended), never a gauge that a sub-second run can finish between two scrapes.
    ttft, itl, e2e = summary["ttft"], summary["itl"], summary["e2e"]
    assert 0 < ttft["p50_ms"] <= ttft["p99_ms"] < 120_000
    # One gap between consecutive token chunks: at most ~32 a request. Fewer when the machine
    # is busy: vLLM's output collector merges the deltas of a request whose API-server side
    # fell behind into one chunk (seen: 30 a request while another test suite ran), so only
    # the upper bound and "some gaps per request" hold every time.
    assert 0 < itl["p50_ms"] < 10_000 and REQUESTS <= itl["count"] <= REQUESTS * 33
    assert e2e["mean_ms"] > ttft["mean_ms"]
    assert summary["output_tokens_per_s"] > 0
    assert report["engine"]["scrapes"] >= 2 and report["engine"]["generation_tokens"] > 0
    assert report["engine"]["kv_cache_usage_max"] is not None
    entries = json.loads((tmp_path / "run" / "locust-stats.json").read_text())
    counts = {(e["method"], e["name"]): e["num_requests"] for e in entries}
    assert counts[("POST", "chat")] == REQUESTS and counts[("TTFT", "chat")] == REQUESTS
    assert (tmp_path / "run" / "report.html").stat().st_size > 5_000


# What the medians of our harness and vLLM's benchmark client are held to. On quiet rounds (no
# client's middle rounds spread wider than 10%) the claim itself: within 10%. Five rounds of 64
# prompts a client (about 15 s a round on the AVX2 2-core machine, 3 minutes in all): with five, one
# round moved by the machine is left out of the spread and cannot move the median
# (docs/load-testing.md, cross-check); there, every run was quiet and agreed within 6%. On a 2-core
# machine whose engine ran 2.5x faster, its API server and the clients competed for the cores and
# every run was INCONCLUSIVE (middle rounds spread 24-56%), so there only what no run moved is held:
# the throughput ratio (0.79-0.96) and the engine's own mean TTFT under each client (0.93-1.11: both
# clients put the same load on the engine), with a margin. The clients' own mean TTFT ratio ranged
# 0.51-1.53 there: time spent waiting for a core outside the engine, not a property of either
# harness; it is held only to the same order (a unit or a clock mistake would be 1000x). On the
# AVX-512 machine (2026-12-04) vLLM's client itself waited 5-7x the engine's own first-token time in
# three runs (its rounds 27-462 ms, the engine's 15-28 ms under both clients, ours 29-169 ms; ratios
# 0.26, 0.80, 0.32): there its median measures its own waiting, not the engine. The same happened to
# ours in a clean-clone run here (2026-12-06): four of its five rounds at 130-222 ms against the
# engine's 13-18 ms under them, vLLM's at 26-39 ms, a ratio of 4.6. So each client is first held to
# the engine's count under it: ours always (no sooner than the engine made the token, per round and
# so for the medians; no later than 20x that: a stalled machine adds time outside the engine, 9.4x
# in that run, a unit or clock mistake would be 1000x), and the two clients' ratio only when both
# medians are within TRACKS_ENGINE times the engine's under them. CI on 2026-12-05 then stalled
# inside our client: three of its five rounds ran at 555-562 tok/s, two at 875-879, while the engine
# under those slow rounds was faster than ever (its TTFT 13 ms, vLLM's client's rounds 18.7); the
# throughput ratio of the medians came out 0.595 and the engine TTFT ratio 0.705. So on a noisy run
# the ratios are held only to the same order (a unit or a clock mistake is 1000x), and the test
# checks from the rounds themselves that the machine, not the harness, made the run noisy: some
# judged metric's middle rounds do spread wider than the tolerance.
QUIET = 0.10
BUSY_RATIO = (0.33, 3.0)
TRACKS_ENGINE = 3.0
JUDGED = {"output tokens/s": "output_tokens_per_s", "mean TTFT (ms)": "mean_ttft_ms"}


def middle_spread(values: list[float]) -> float:
    """The middle rounds' range over the median, lowest and highest left out."""
    ordered = sorted(values)
    middle = ordered[1:-1]
    return (middle[-1] - middle[0]) / ordered[len(ordered) // 2]


def crosscheck(stack: Stack, tokenizer: Path, out: Path) -> int:
    return main([
        "crosscheck", "--host", stack.engine_url, "--engine-metrics", f"{stack.engine_url}/metrics",
        "--tokenizer", str(tokenizer), "--concurrency", "4", "--num-prompts", "64",
        "--rounds", "5", "--out", str(out),
    ])  # fmt: skip


def test_crosscheck_medians_agree_with_vllm_bench(stack: Stack, tmp_path: Path) -> None:
    """Interleaved rounds of both clients on the real engine: the same work, medians close."""
    tokenizer = Path(serving_env()["SERVING_HOME"]) / "models" / "qwen3-tiny"
    out = tmp_path / "crosscheck"
    with stack.off_the_books():  # both clients measure the engine itself
        code = crosscheck(stack, tokenizer, out)

    result = json.loads((out / "crosscheck.json").read_text())
    rounds = result["round_results"]
    assert len(rounds) == 10 and all(r["completed"] == 64 and r["failed"] == 0 for r in rounds)
    # Distinct prompts a round, 64 tokens into 128-token blocks: the engine cached nothing.
    assert all(r["prefix_cache_hits"] == 0 for r in rounds), rounds
    assert all(r["cpu_ms_per_request"] and r["engine_ttft_ms"] for r in rounds), rounds
    comparisons = {c["metric"]: c for c in result["comparisons"]}
    throughput, ttft = comparisons["output tokens/s"], comparisons["mean TTFT (ms)"]
    if result["noisy"]:
        assert code == 3 and result["verdict"].startswith("INCONCLUSIVE"), result["reasons"]
        spreads = [
            middle_spread([float(r[field]) for r in rounds if r["client"] == client])
            for field in JUDGED.values()
            for client in ("ours", "vllm")
        ]
        assert max(spreads) > QUIET, (spreads, comparisons)
        engine = comparisons["engine's mean TTFT (ms)"]
        for held in (throughput, engine):
            assert BUSY_RATIO[0] < held["ratio"] < BUSY_RATIO[1], comparisons
        ours, under_ours = ttft["ours"]["median"], engine["ours"]["median"]
        assert under_ours <= ours <= 20 * under_ours, comparisons
        if all(ttft[c]["median"] <= TRACKS_ENGINE * engine[c]["median"] for c in ("ours", "vllm")):
            assert BUSY_RATIO[0] < ttft["ratio"] < BUSY_RATIO[1], comparisons
    else:
        assert abs(throughput["ratio"] - 1) <= QUIET, comparisons
        gap, floor = abs(ttft["ours"]["median"] - ttft["vllm"]["median"]), FLOORS[ttft["metric"]]
        assert abs(ttft["ratio"] - 1) <= QUIET or gap <= floor, comparisons
        assert code == 0 and result["verdict"] == "AGREE", comparisons
