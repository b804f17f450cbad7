"""Command line of the routing benchmark (see the package docstring)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from bench.command import run_benchmark
from bench.gateway_overhead import report
from bench.gateway_overhead.processes import BenchError
from bench.gateway_overhead.runner import Plan
from bench.results_files import RESULTS_DIR, loadavg, machine
from bench.routing import router, table
from bench.routing.overhead import DEFAULT_PATHS, OverheadOptions, check_paths, run_overhead
from bench.routing.paths import SPECS
from bench.routing.prefix_cache import CACHE_PATHS, CacheOptions, run_prefix_cache
from bench.routing.workload import Shape

STEM = "routing"
# The gateway overhead benchmark's full plan, so the two benchmarks' numbers compare. The
# quick one is a smoke run for the tests: every path measured twice (the interleaving and
# the medians run), as short as still gives each proxy's CPU a few hundred requests.
FULL = Plan(seconds=4.0, runs=3, concurrency=32, warmup_s=1.0)
QUICK = Plan(seconds=0.3, runs=2, concurrency=32, warmup_s=0.2, warm_s=0.1)
FULL_SHAPE = Shape(conversations=8, turns=8)
QUICK_SHAPE = Shape(conversations=4, turns=3)
PARTS = ("overhead", "cache")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.routing",
        description=(
            "Routing across vLLM replicas: vllm-router vs routing in our gateway, side by side "
            "(added latency, req/s, CPU per request; vLLM's prefix cache hit rate)."
        ),
    )
    parser.add_argument("--quick", action="store_true", help="short run, for tests")
    parser.add_argument(
        "--parts",
        default=",".join(PARTS),
        help="overhead (fast upstreams), cache (two real engines); default: %(default)s",
    )
    parser.add_argument("--seconds", type=float, help="seconds per overhead measurement")
    parser.add_argument("--runs", type=int, help="interleaved overhead rounds (medians)")
    parser.add_argument("--concurrency", type=int, help="requests in flight for req/s, streams/s")
    parser.add_argument(
        "--paths",
        default=",".join(DEFAULT_PATHS),
        help=f"overhead paths besides direct (of {', '.join(n for n in SPECS if n != 'direct')};"
        " default: %(default)s)",
    )
    parser.add_argument(
        "--cache-paths",
        default=",".join(CACHE_PATHS),
        help="prefix cache paths (default: %(default)s)",
    )
    parser.add_argument("--conversations", type=int, help="prefix cache workload conversations")
    parser.add_argument("--turns", type=int, help="turns per conversation")
    parser.add_argument("--engine-profile", default="cpu-tiny", help="engines' profile")
    parser.add_argument(
        "--output-dir",
        type=Path,
        default=RESULTS_DIR,
        help="results go to DIR/routing/<date>.json and .md (default: bench/results)",
    )
    return parser


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


async def run(args: argparse.Namespace, command: Sequence[str]) -> int:
    parts = _names(args.parts)
    if unknown := [p for p in parts if p not in PARTS]:
        raise BenchError(f"--parts: unknown {unknown} (choose from {', '.join(PARTS)})")
    base, shape = (QUICK, QUICK_SHAPE) if args.quick else (FULL, FULL_SHAPE)
    plan = Plan(
        seconds=args.seconds or base.seconds,
        runs=args.runs or base.runs,
        concurrency=args.concurrency or base.concurrency,
        warmup_s=base.warmup_s,
        warm_s=base.warm_s,
    )
    shape = Shape(
        conversations=args.conversations or shape.conversations,
        turns=args.turns or shape.turns,
        concurrency=shape.concurrency,
    )
    paths, cache_paths = _names(args.paths), _names(args.cache_paths)
    check_paths(paths)
    if unknown := [p for p in cache_paths if p not in SPECS]:
        raise BenchError(f"--cache-paths: unknown {unknown} (choose from {', '.join(SPECS)})")
    host = {**machine(), "loadavg_before": loadavg()}
    doc: dict[str, object] = {
        "benchmark": "routing",
        "created": datetime.now(UTC).replace(microsecond=0).isoformat(),
        "command": " ".join(["python -m bench.routing", *command]),
        "router_version": _router_version(),
        "machine": host,
    }
    if "overhead" in parts:
        doc["overhead"] = await run_overhead(OverheadOptions(paths=paths, plan=plan), log)
    if "cache" in parts:
        options = CacheOptions(paths=cache_paths, shape=shape, profile=args.engine_profile)
        doc["prefix_cache"] = await run_prefix_cache(options, log)
    host["loadavg_after"] = loadavg()
    cleaned = report.clean(doc)
    assert isinstance(cleaned, dict)
    text = table.markdown(cleaned)
    written = report.write_results(cleaned, args.output_dir, STEM, text)
    print(text)
    log(f"wrote {written[0]} and {written[1]}")
    return 0


def _router_version() -> str:
    try:
        return router.version()
    except router.RouterUnavailable:
        return "not installed"


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(arguments)
    return run_benchmark("routing", run(args, arguments))


if __name__ == "__main__":
    sys.exit(main())
