"""Command line of the gateway overhead benchmark (see the package docstring)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from bench.command import run_benchmark
from bench.gateway_overhead import report, table
from bench.gateway_overhead.local import PROFILE_MODES, LocalOptions, run_local
from bench.gateway_overhead.paths import ALL_PATHS
from bench.gateway_overhead.processes import BenchError
from bench.gateway_overhead.real_engine import RealOptions, run_real
from bench.gateway_overhead.runner import Plan
from bench.results_files import RESULTS_DIR
from serving.gateway.settings import API_KEY_ENV

FULL = Plan(seconds=4.0, runs=3, concurrency=32, warmup_s=1.0)
# A smoke run for the tests: every path twice (interleaving and medians run), each
# measurement as short as still gives each proxy's CPU a few hundred requests.
QUICK = Plan(seconds=0.3, runs=2, concurrency=32, warmup_s=0.2, warm_s=0.1)
SECRET_FLAGS = ("--api-key", "--engine-api-key")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.gateway_overhead",
        description=(
            "Gateway overhead: direct vs passthrough vs serving gateway (in-process and Redis "
            "quota store) vs LiteLLM."
        ),
    )
    parser.add_argument("--quick", action="store_true", help="short run (< 60 s), for tests")
    parser.add_argument("--seconds", type=float, help="seconds per measurement")
    parser.add_argument("--runs", type=int, help="interleaved rounds (medians; >= 2)")
    parser.add_argument("--concurrency", type=int, help="requests in flight for req/s, streams/s")
    parser.add_argument(
        "--paths",
        default=",".join(p for p in ALL_PATHS if p != "direct"),
        help="proxies to measure besides direct, comma-separated (default: %(default)s)",
    )
    parser.add_argument(
        "--profile",
        choices=PROFILE_MODES,
        default="auto",
        help="py-spy profile of the gateway: when a target is missed (auto)",
    )
    parser.add_argument(
        "--output-dir",
        type=Path,
        default=RESULTS_DIR,
        help="results go to DIR/gateway_overhead/<date>.json and .md (default: bench/results)",
    )
    real = parser.add_argument_group("real engine (nothing is started: bring your own)")
    real.add_argument("--real-engine", metavar="URL", help="a running vLLM OpenAI server")
    real.add_argument("--gateway-url", metavar="URL", help="a running gateway in front of it")
    real.add_argument(
        "--api-key",
        default=os.environ.get(API_KEY_ENV, ""),
        help=f"gateway key (default: ${API_KEY_ENV})",
    )
    real.add_argument("--engine-api-key", default="", help="vLLM's --api-key, if it has one")
    real.add_argument("--model", default="", help="model name (default: the engine's first)")
    return parser


def plan_from(args: argparse.Namespace) -> Plan:
    base = QUICK if args.quick else FULL
    plan = Plan(
        seconds=args.seconds or base.seconds,
        runs=args.runs or base.runs,
        concurrency=args.concurrency or base.concurrency,
        warmup_s=base.warmup_s,
        warm_s=base.warm_s,
    )
    if plan.seconds <= 0 or plan.runs < 1 or plan.concurrency < 1:
        raise BenchError(f"--seconds/--runs/--concurrency: must be positive, got {plan}")
    return plan


def shown_command(argv: Sequence[str]) -> str:
    """The command line with secrets replaced."""
    shown: list[str] = []
    hide = False
    for arg in argv:
        if hide:
            shown.append("***")
            hide = False
            continue
        flag, equals, _ = arg.partition("=")
        if flag in SECRET_FLAGS:
            shown.append(f"{flag}=***" if equals else arg)
            hide = not equals
        else:
            shown.append(arg)
    return " ".join(["python -m bench.gateway_overhead", *shown])


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


async def run(args: argparse.Namespace, command: str) -> int:
    plan = plan_from(args)
    if args.real_engine:
        if not args.gateway_url or not args.api_key:
            raise BenchError("--real-engine needs --gateway-url and --api-key")
        options = RealOptions(
            engine_url=args.real_engine,
            gateway_url=args.gateway_url,
            api_key=args.api_key,
            engine_api_key=args.engine_api_key,
            model=args.model,
            plan=plan,
            command=command,
        )
        doc = await run_real(options, log)
        text, stem = table.real_markdown(doc), "gateway_overhead_real"
    else:
        names = [name.strip() for name in args.paths.split(",") if name.strip()]
        unknown = [name for name in names if name not in ALL_PATHS]
        if unknown:
            raise BenchError(f"--paths: unknown {unknown} (choose from {', '.join(ALL_PATHS)})")
        local = LocalOptions(
            paths=[name for name in names if name != "direct"],
            plan=plan,
            profile=args.profile,
            profile_seconds=2.0 if args.quick else 6.0,
            command=command,
        )
        doc = await run_local(local, log)
        text, stem = table.local_markdown(doc), "gateway_overhead"
    written = report.write_results(doc, args.output_dir, stem, text)
    print(text)
    log(f"wrote {written[0]} and {written[1]}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(arguments)
    return run_benchmark("gateway_overhead", run(args, shown_command(arguments)))


if __name__ == "__main__":
    sys.exit(main())
