"""Command line of the batch benchmark (see the package docstring)."""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from bench.batch.interactive import INTERACTIVE_MAX_TOKENS
from bench.batch.measure import Plan, measure_run
from bench.batch.stack import GATEWAY_CPU, KEY_NAMES, PROFILE, SCHEDULING, bench_stack
from bench.command import run_benchmark
from bench.gateway_overhead.processes import can_pin, pin_self
from bench.gateway_overhead.report import write_results
from bench.results_files import RESULTS_DIR, loadavg, machine, machine_lines

STEM = "batch"
GOAL = {"median": 1.2, "worst": 1.5, "share": 0.8}
QUICK = {"seconds": 4.0, "lines": 20, "batch_max_tokens": 4, "runs": 1}

Run = dict[str, dict[str, object]]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.batch",
        description="An interactive key's TTFT beside a batch, and the batch's share of the "
        "engine's idle throughput.",
    )
    parser.add_argument("--runs", type=int, default=3, help="runs in a row (medians)")
    parser.add_argument("--seconds", type=float, default=20.0, help="interactive load alone")
    parser.add_argument("--lines", type=int, default=2000, help="batch lines")
    parser.add_argument("--batch-max-tokens", type=int, default=8, help="max_tokens per line")
    parser.add_argument("--concurrency", type=int, default=2, help="interactive requests at once")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one run (the test)")
    parser.add_argument(
        "--output-dir",
        type=Path,
        default=RESULTS_DIR,
        help="results go to DIR/batch/<date>.json and .md (default: bench/results)",
    )
    return parser


async def run(args: argparse.Namespace) -> dict[str, object]:
    if can_pin():
        pin_self(GATEWAY_CPU)
    plan = Plan(args.seconds, args.lines, args.batch_max_tokens, args.concurrency)
    before = loadavg()
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="bench-batch-") as tmp:
        print(f"starting a {PROFILE} engine and a gateway ...", flush=True)
        async with bench_stack(Path(tmp)) as stack:
            for number in range(1, args.runs + 1):
                runs.append(await measure_run(stack, plan))
                print(f"run {number}: {json.dumps(runs[-1])}", flush=True)
            slots = stack.engine_slots
    return {
        "benchmark": STEM,
        "created": datetime.now(UTC).replace(microsecond=0).isoformat(),
        "command": "python -m bench.batch " + " ".join(sys.argv[1:]),
        "machine": {**machine(), "loadavg_before": before, "loadavg_after": loadavg()},
        "plan": {
            "profile": PROFILE,
            "scheduling": SCHEDULING,
            "engine_slots": slots,
            "keys": list(KEY_NAMES),
            "runs": args.runs,
            "interactive_seconds_alone": plan.seconds,
            "interactive_concurrency": plan.concurrency,
            "interactive_max_tokens": INTERACTIVE_MAX_TOKENS,
            "batch_lines": plan.lines,
            "batch_max_tokens": plan.batch_max_tokens,
        },
        "runs": runs,
        "ratios": [ratios(one) for one in runs],
    }


def _ratio(value: object, base: object) -> float:
    if isinstance(value, int | float) and isinstance(base, int | float) and base:
        return float(value) / float(base)
    return math.nan


def ratios(one: Run) -> dict[str, float]:
    """A run's three numbers against the goal: TTFT beside the batch over alone (median,
    worst), the batch's tokens/s beside interactive load over alone."""
    beside = one["both"]["interactive"]
    assert isinstance(beside, dict)
    return {
        "median": _ratio(beside["median_ms"], one["alone"]["median_ms"]),
        "worst": _ratio(beside["worst_ms"], one["alone"]["worst_ms"]),
        "share": _ratio(one["both"]["tokens_per_s"], one["batch_alone"]["tokens_per_s"]),
    }


def _cells(values: Sequence[float], digits: int) -> str:
    listed = ", ".join(f"{value:.{digits}f}" for value in values)
    return f"{statistics.median(values):.{digits}f} ({listed})"


def report(doc: dict[str, object]) -> str:
    runs = doc["runs"]
    found = doc["ratios"]
    assert isinstance(runs, list) and isinstance(found, list)

    def pick(where: str, field: str) -> list[float]:
        rows = [run["both"]["interactive"] if where == "beside" else run[where] for run in runs]
        return [float(row[field]) for row in rows]

    lines = [
        "# Batch beside interactive load", "",
        f"`{doc['command']}` at {doc['created']}; plan: {json.dumps(doc['plan'])}.", "",
        *machine_lines(doc["machine"]),
        "The interactive key's time to first token (closed loop of short streamed chats),",
        "alone and while the batch key's batch runs; the batch's generated tokens/s (vLLM's",
        "counter over the batch's in-progress time, less the interactive tokens) alone and",
        "beside the interactive load. Medians, each run in brackets.", "",
        "| measure | alone | beside | ratio | goal |",
        "|---|---|---|---|---|",
        f"| TTFT median ms | {_cells(pick('alone', 'median_ms'), 0)} "
        f"| {_cells(pick('beside', 'median_ms'), 0)} "
        f"| {_cells([r['median'] for r in found], 2)} | <= {GOAL['median']} |",
        f"| TTFT worst ms | {_cells(pick('alone', 'worst_ms'), 0)} "
        f"| {_cells(pick('beside', 'worst_ms'), 0)} "
        f"| {_cells([r['worst'] for r in found], 2)} | <= {GOAL['worst']} |",
        f"| batch tokens/s | {_cells(pick('batch_alone', 'tokens_per_s'), 1)} "
        f"| {_cells(pick('both', 'tokens_per_s'), 1)} "
        f"| {_cells([r['share'] for r in found], 2)} | >= {GOAL['share']} |",
        f"| batch seconds | {_cells(pick('batch_alone', 'seconds'), 1)} "
        f"| {_cells(pick('both', 'seconds'), 1)} | | |",
        f"| interactive requests | {_cells(pick('alone', 'n'), 0)} "
        f"| {_cells(pick('beside', 'n'), 0)} | | |",
        "",
        *verdicts(found),
    ]  # fmt: skip
    return "\n".join(lines) + "\n"


def verdicts(found: list[dict[str, float]]) -> list[str]:
    """One line per goal: in how many runs it held."""
    lines = []
    for name, text in (("median", "TTFT median ratio <= 1.2"), ("worst", "TTFT worst ratio <= 1.5"),
                       ("share", "batch share >= 0.8")):  # fmt: skip
        held = [
            value >= GOAL[name] if name == "share" else value <= GOAL[name]
            for value in (one[name] for one in found)
        ]
        mark = "held" if all(held) else "**MISS**"
        lines.append(f"- {text}: {sum(held)}/{len(held)} runs, {mark}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.quick:
        for name, value in QUICK.items():
            setattr(args, name, value)
    if min(args.runs, args.lines, args.batch_max_tokens, args.concurrency) < 1 or args.seconds <= 0:
        print("--runs, --seconds, --lines, ...: must be positive", file=sys.stderr)
        return 2
    return run_benchmark("bench.batch", measure_and_report(args))


async def measure_and_report(args: argparse.Namespace) -> int:
    doc = await run(args)
    text = report(doc)
    write_results(doc, args.output_dir, STEM, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
