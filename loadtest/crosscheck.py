"""Cross-check: the same workload through vLLM's benchmark client and through ours, one run.

Both send N prompts of the same workload at the same concurrency (closed loop, no rate
limit) to the same engine, vLLM's client first. Each gets its own seeded prompt set with the
same length distribution: with prefix caching on, the second client sending identical
prompts would get cache hits the first did not, and its TTFT would not be comparable.
Output throughput and mean TTFT must agree within 10%; when they do not, the result lists
the likely reasons it can see (load generator CPU-bound, failures, too few requests,
latencies so small that a millisecond is 10%).

Usage: `result = run_crosscheck(plan, base_url=..., concurrency=4, num_prompts=64, out=dir)`.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from loadtest.analysis import Report, analyze
from loadtest.errors import LoadTestError
from loadtest.plan import Plan
from loadtest.prompts import generate_prompts, load_tokenizer, write_prompts
from loadtest.report import write_report
from loadtest.runner import LocustRun, run_locust
from serving.engine.flags import BenchServe, bench_serve_args

TOLERANCE = 0.10
# Below this mean TTFT a 10% gap is a fraction of a millisecond: timer and scheduling noise.
SMALL_TTFT_MS = 20.0
# A TTFT gap under this is within what OS scheduling adds when clients share cores with the engine.
SMALL_GAP_MS = 10.0


@dataclass(frozen=True)
class Comparison:
    metric: str
    ours: float
    vllm: float

    @property
    def ratio(self) -> float:
        return self.ours / self.vllm if self.vllm else float("inf")

    @property
    def agree(self) -> bool:
        return abs(self.ratio - 1) <= TOLERANCE


@dataclass(frozen=True)
class CrosscheckResult:
    comparisons: list[Comparison]
    reasons: list[str]
    vllm: dict[str, Any]
    ours: Report

    @property
    def agree(self) -> bool:
        return all(c.agree for c in self.comparisons)

    def table(self) -> str:
        lines = [f"{'metric':<22}{'ours':>12}{'vllm bench':>12}{'ratio':>8}  result"]
        for c in self.comparisons:
            verdict = "ok" if c.agree else f"DIFFERS (>{TOLERANCE:.0%})"
            lines.append(
                f"{c.metric:<22}{c.ours:>12,.2f}{c.vllm:>12,.2f}{c.ratio:>8.3f}  {verdict}"
            )
        lines += [f"why: {reason}" for reason in self.reasons]
        return "\n".join(lines)


def vllm_bench_command(
    *, base_url: str, plan: Plan, prompts: Path, concurrency: int, num_prompts: int, result: Path
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
    args = bench_serve_args(bench)
    return [sys.executable, "-m", "loadtest.vllm_bench", "--json-out", str(result), "--", *args]


def run_vllm_bench(command: list[str], api_key: str | None, log: Path) -> dict[str, Any]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if api_key:
        env["OPENAI_API_KEY"] = api_key
    result = Path(command[command.index("--json-out") + 1])
    with log.open("w") as sink:
        code = subprocess.call(command, env=env, stdout=sink, stderr=subprocess.STDOUT)
    if code != 0 or not result.exists():
        tail = log.read_text(errors="replace")[-2000:]
        raise LoadTestError(f"vllm bench serve failed ({code}):\n{tail}")
    data: dict[str, Any] = json.loads(result.read_text(encoding="utf-8"))
    return data


def reasons_for(
    ours: Report,
    vllm: dict[str, Any],
    concurrency: int,
    num_prompts: int,
    differing: list[Comparison],
) -> list[str]:
    """Why the two clients disagree: the causes we can detect, else the gap itself.

    Never empty when something differs: the issue's contract is "agree or say why not", so
    when no known cause is visible the reason states the gap and what to do about it.
    """
    found: list[str] = []
    if ours.cpu["bottleneck"]:
        found.append("our load generator was CPU-bound (see the report's CPU chart)")
    if ours.summary.failed or vllm.get("failed"):
        found.append(f"failed requests: ours {ours.summary.failed}, vllm {vllm.get('failed')}")
    if num_prompts < 10 * concurrency:
        found.append(
            f"{num_prompts} requests at concurrency {concurrency}: start and tail "
            "effects dominate; use at least 10x the concurrency"
        )
    mean = ours.summary.ttft.mean_ms or 0.0
    if mean < SMALL_TTFT_MS:
        found.append(f"mean TTFT is {mean:.1f} ms: a 10% difference is below timer noise")
    if ours.cpu["host_mean_percent"] >= 90:
        found.append(
            f"the machine was {ours.cpu['host_mean_percent']:.0f}% busy: the clients "
            "compete with the engine for CPU"
        )
    for c in differing:
        gap = abs(c.ours - c.vllm)
        if c.metric.startswith("mean TTFT") and gap < SMALL_GAP_MS:
            found.append(
                f"TTFT differs by {gap:.1f} ms per request: on a host with "
                f"{os.cpu_count()} cores shared by engine and clients, a few ms of "
                "scheduling delay is this large"
            )
    if not found:
        gaps = ", ".join(f"{c.metric} ours {c.ours:,.2f} vs {c.vllm:,.2f}" for c in differing)
        found.append(
            f"no known cause detected ({gaps}); rerun: a gap that repeats is a difference "
            "in what the two clients measure, one that does not is noise"
        )
    return found


def run_crosscheck(
    plan: Plan,
    *,
    base_url: str,
    concurrency: int,
    num_prompts: int,
    out: Path,
    api_key: str | None = None,
    metrics: dict[str, str] | None = None,
    meta: dict[str, Any] | None = None,
) -> CrosscheckResult:
    out.mkdir(parents=True, exist_ok=True)
    theirs = out / "prompts-vllm.jsonl"
    workload = plan.workload.model_copy(update={"seed": plan.workload.seed + 1})
    write_prompts(
        generate_prompts(
            workload, load_tokenizer(plan.tokenizer), max_model_len=plan.max_model_len
        ),
        theirs,
    )
    command = vllm_bench_command(
        base_url=base_url,
        plan=plan,
        prompts=theirs,
        concurrency=concurrency,
        num_prompts=num_prompts,
        result=out / "vllm-bench.json",
    )
    vllm = run_vllm_bench(command, api_key, out / "vllm-bench.log")
    data = run_locust(
        LocustRun(
            host=base_url,
            model=plan.model,
            prompts_path=plan.prompts_path,
            out=out / "ours",
            users=concurrency,
            duration_s=3600,
            processes=1,
            api_key=api_key,
            metrics=metrics,
            max_requests=num_prompts,
            ordered=True,
        )
    )
    ours = analyze(data, plan.targets, meta={**(meta or {}), "role": "cross-check (ours)"})
    write_report(ours, out / "ours")
    comparisons = [
        Comparison(
            "output tokens/s", ours.summary.output_tokens_per_s, float(vllm["output_throughput"])
        ),
        Comparison("mean TTFT (ms)", ours.summary.ttft.mean_ms or 0.0, float(vllm["mean_ttft_ms"])),
        Comparison(
            "mean TPOT (ms)", ours.summary.tpot.mean_ms or 0.0, float(vllm.get("mean_tpot_ms", 0))
        ),
    ]
    checked = comparisons[:2]  # TPOT is shown, not judged: the issue asks for the first two
    differing = [c for c in checked if not c.agree]
    reasons = reasons_for(ours, vllm, concurrency, num_prompts, differing) if differing else []
    result = CrosscheckResult(checked, reasons, vllm, ours)
    summary = {
        "agree": result.agree,
        "tolerance": TOLERANCE,
        "comparisons": [asdict(c) | {"ratio": c.ratio, "agree": c.agree} for c in comparisons],
        "reasons": reasons,
        "vllm": vllm,
        "ours": asdict(ours.summary),
        "command": command,
    }
    (out / "crosscheck.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return result
