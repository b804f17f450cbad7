"""Cross-check: the same workload through vLLM's benchmark client and through ours, in rounds.

One run of each client says little on a machine whose clients share cores with the engine:
three runs in a row on an idle 2-core stack gave throughput ratios of 0.84, 0.70 and 1.32.
So the clients take turns, round after round (`rounds` each), in pairs whose order
alternates (ours, vllm, vllm, ours, ours, vllm, ...) so that a machine getting busier or
quieter over the run weighs on both sides alike, and the verdict compares medians
(loadtest.crosscheck_verdict). Every round is the same closed loop: `num_prompts` prompts at
`concurrency` in flight, no rate limit, each client measured over its own request window.

Every round gets its own seeded prompt set with the workload's length distribution: with
prefix caching on, a round repeating an earlier round's prompts would get cache hits the
first did not. (vLLM's /reset_prefix_cache would do too, but the server exposes it only in
its dev mode, which a stack started with `make up` does not run.) The engine's counters are
read before and after each round: its prefix-cache hits (none, or the prompts leaked), and
its own mean TTFT and request latency, to tell a client that measures differently from an
engine that ran slower while that client's rounds ran.

Each client is charged the CPU its process tree used in its request window (psutil): a
client that costs more CPU per request takes that CPU from the engine it measures.

Usage: `result = run_crosscheck(plan, base_url=..., concurrency=4, num_prompts=128,
rounds=3, out=dir)`; `result.verdict.table()`.
"""

from __future__ import annotations

import json
import math
import urllib.error
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from loadtest.crosscheck_verdict import TOLERANCE, RoundResult, Verdict, judge
from loadtest.plan import Plan
from loadtest.prompts import Tokenizer, generate_prompts, load_tokenizer, write_prompts
from loadtest.runner import LocustRun, run_locust
from loadtest.scraper import PREFIX_HITS, fetch
from loadtest.stats import summarize
from loadtest.vllm_worker import VllmBenchWorker
from serving.vllm_flags import BenchServe, bench_serve_args

# The engine's own histograms (sum and count) of time to first token and request latency:
# per round, what the engine saw, beside what each client measured.
ENGINE_TTFT = "vllm:time_to_first_token_seconds"
ENGINE_E2E = "vllm:e2e_request_latency_seconds"
ENGINE_COUNTERS = {
    PREFIX_HITS,
    *(f"{series}_{part}" for series in (ENGINE_TTFT, ENGINE_E2E) for part in ("sum", "count")),
}
# vLLM's client (request rate inf) sends its first `concurrency` requests at once; our users
# start 10 ms apart so both clients offer the engine the same arrival pattern. The load
# test's default spreads them over a second, and with fixed prompt and output lengths users
# started apart stay apart. (Above 100 users/s Locust warns that ramps that fast misbehave.)
ALL_AT_ONCE = 100.0
# Our client's CPU is sampled this often (the runner's CpuMonitor); vLLM's worker the same.
CPU_INTERVAL_S = 0.25


@dataclass(frozen=True)
class CrosscheckResult:
    verdict: Verdict
    out: Path

    @property
    def agree(self) -> bool:
        return self.verdict.agree


def round_order(rounds: int) -> list[tuple[str, int]]:
    """(client, its round number): pairs alternate who goes first, so drift hits both."""
    order: list[tuple[str, int]] = []
    for index in range(1, rounds + 1):
        pair = ("ours", "vllm") if index % 2 else ("vllm", "ours")
        order += [(client, index) for client in pair]
    return order


def vllm_bench_args(
    *, base_url: str, plan: Plan, prompts: Path, concurrency: int, num_prompts: int
) -> list[str]:
    bench = BenchServe(
        backend="openai-chat",
        base_url=base_url.rstrip("/"),
        endpoint="/v1/chat/completions",
        model=plan.model,
        served_model_name=plan.model,
        tokenizer=plan.tokenizer,
        dataset_name="custom",
        dataset_path=str(prompts),
        custom_output_len=-1,  # each prompt's own output length
        skip_chat_template=True,
        num_prompts=num_prompts,
        max_concurrency=concurrency,
        request_rate=math.inf,
        temperature=0.0,
        disable_tqdm=True,
        percentile_metrics="ttft,tpot,itl,e2el",
        ignore_eos=all(s.ignore_eos for s in plan.workload.scenarios),
    )
    return bench_serve_args(bench)


def write_round_prompts(
    plan: Plan, tokenizer: Tokenizer, position: int, num_prompts: int, path: Path
) -> Path:
    """A prompt set no other round uses: the workload's seed moved by the round's place."""
    workload = plan.workload.model_copy(
        update={"seed": plan.workload.seed + 1000 * position, "num_prompts": num_prompts}
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    write_prompts(generate_prompts(workload, tokenizer, max_model_len=plan.max_model_len), path)
    return path


def engine_counters(engine_metrics: str | None, headers: dict[str, str]) -> dict[str, float]:
    """The engine's counters the rounds are checked against ({} when not scraped)."""
    if not engine_metrics:
        return {}
    try:
        text = fetch(engine_metrics, headers, 10.0)
    except (OSError, urllib.error.URLError):
        return {}
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in ENGINE_COUNTERS:
                found[sample.name] = found.get(sample.name, 0.0) + float(sample.value)
    return found


def engine_view(before: dict[str, float], after: dict[str, float]) -> dict[str, float | None]:
    """What the engine itself saw of a round: prefix cache hits, mean TTFT and latency."""

    def mean_ms(series: str) -> float | None:
        count = after.get(f"{series}_count", 0.0) - before.get(f"{series}_count", 0.0)
        total = after.get(f"{series}_sum", 0.0) - before.get(f"{series}_sum", 0.0)
        return total / count * 1000 if count > 0 else None

    hits = PREFIX_HITS in before and PREFIX_HITS in after
    return {
        "prefix_cache_hits": after[PREFIX_HITS] - before[PREFIX_HITS] if hits else None,
        "engine_ttft_ms": mean_ms(ENGINE_TTFT),
        "engine_e2e_ms": mean_ms(ENGINE_E2E),
    }


def our_round(
    plan: Plan, *, base_url: str, prompts: Path, out: Path, concurrency: int, num_prompts: int,
    api_key: str | None, position: int, index: int,
) -> RoundResult:  # fmt: skip
    data = run_locust(
        LocustRun(
            host=base_url,
            model=plan.model,
            prompts_path=prompts,
            out=out,
            users=concurrency,
            spawn_rate=ALL_AT_ONCE,
            duration_s=3600,
            processes=1,
            api_key=api_key,
            scrape_interval_s=CPU_INTERVAL_S,
            # One Locust sample per token costs CPU the engine could use; the records keep
            # every gap anyway (measured: see docs/load-testing.md, cross-check).
            itl_events=False,
            max_requests=num_prompts,
            ordered=True,
        )
    )
    summary = summarize(data.records)
    return RoundResult(
        client="ours",
        index=index,
        position=position,
        completed=summary.succeeded,
        failed=summary.failed,
        duration_s=summary.duration_s,
        output_tokens_per_s=summary.output_tokens_per_s,
        mean_ttft_ms=summary.ttft.mean_ms or 0.0,
        mean_tpot_ms=summary.tpot.mean_ms or 0.0,
        cpu_ms_per_request=_per_request(data.cpu.cpu_seconds, summary.succeeded),
        host_cpu_percent=data.cpu.host_mean_percent,
    )


def vllm_round(
    worker: VllmBenchWorker, args: list[str], *, out: Path, position: int, index: int
) -> RoundResult:
    out.mkdir(parents=True, exist_ok=True)
    result = worker.run(args, out=out / "vllm-bench.json")
    completed = int(result["completed"])
    return RoundResult(
        client="vllm",
        index=index,
        position=position,
        completed=completed,
        failed=int(result.get("failed") or 0),
        duration_s=float(result["duration"]),
        output_tokens_per_s=float(result["output_throughput"]),
        mean_ttft_ms=float(result["mean_ttft_ms"]),
        mean_tpot_ms=float(result.get("mean_tpot_ms") or 0.0),
        cpu_ms_per_request=_per_request(result.get("cpu_seconds"), completed),
        host_cpu_percent=result.get("host_cpu_percent"),
    )


def _per_request(cpu_seconds: float | None, requests: int) -> float | None:
    return None if cpu_seconds is None or requests == 0 else cpu_seconds * 1000 / requests


def run_crosscheck(
    plan: Plan,
    *,
    base_url: str,
    concurrency: int,
    num_prompts: int,
    rounds: int,
    out: Path,
    api_key: str | None = None,
    engine_metrics: str | None = None,
    tolerance: float = TOLERANCE,
    meta: dict[str, Any] | None = None,
    on_round: Callable[[RoundResult], None] | None = None,
) -> CrosscheckResult:
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = load_tokenizer(plan.tokenizer)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    results: list[RoundResult] = []
    with VllmBenchWorker(log=out / "vllm-bench.log", api_key=api_key) as worker:
        for position, (client, index) in enumerate(round_order(rounds), start=1):
            where = out / f"round-{position:02d}-{client}"
            prompts = write_round_prompts(
                plan, tokenizer, position, num_prompts, where / "prompts.jsonl"
            )
            before = engine_counters(engine_metrics, headers)
            if client == "ours":
                result = our_round(
                    plan, base_url=base_url, prompts=prompts, out=where, concurrency=concurrency,
                    num_prompts=num_prompts, api_key=api_key, position=position, index=index,
                )  # fmt: skip
            else:
                args = vllm_bench_args(
                    base_url=base_url, plan=plan, prompts=prompts, concurrency=concurrency,
                    num_prompts=num_prompts,
                )  # fmt: skip
                result = vllm_round(worker, args, out=where, position=position, index=index)
            after = engine_counters(engine_metrics, headers)
            result = RoundResult(**{**asdict(result), **engine_view(before, after)})
            results.append(result)
            if on_round is not None:
                on_round(result)
    verdict = judge(results, tolerance=tolerance)
    summary = {
        "agree": verdict.agree,
        "verdict": verdict.label,
        "noisy": verdict.noisy,
        "tolerance": tolerance,
        "concurrency": concurrency,
        "num_prompts": num_prompts,
        "rounds": rounds,
        "comparisons": [
            {
                "metric": c.metric,
                "judged": c.judged,
                "ratio": c.ratio,
                "agree": c.agree,
                "noisy": c.noisy,
                "ours": asdict(c.ours) | {"spread": c.ours.relative},
                "vllm": asdict(c.vllm) | {"spread": c.vllm.relative},
            }
            for c in verdict.comparisons
        ],
        "reasons": verdict.reasons,
        "notes": verdict.notes,
        "round_results": [asdict(r) for r in results],
        "meta": meta or {},
    }
    (out / "crosscheck.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return CrosscheckResult(verdict, out)
