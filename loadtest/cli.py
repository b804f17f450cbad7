"""`python -m loadtest`: run, sweep, crosscheck, prompts.

Exit codes: 0 all targets met (or the clients agree), 1 a target missed (or they disagree),
2 the test could not run (bad input, unreachable host, Locust failed).

Usage:
  python -m loadtest run --host http://127.0.0.1:8000 --api-key sk-... \\
      --engine-metrics http://127.0.0.1:8001/metrics --workload short-chat --users 4 \\
      --duration 30s --out var/loadtest/run
  python -m loadtest sweep ... --levels 1,2,4,8
  python -m loadtest crosscheck --host http://127.0.0.1:8001 --concurrency 4 --num-prompts 64 ...
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from loadtest.analysis import analyze
from loadtest.config import StepRamp
from loadtest.crosscheck import run_crosscheck
from loadtest.errors import LoadTestError
from loadtest.plan import Plan, make_plan, parse_duration
from loadtest.report import write_report
from loadtest.runner import LocustRun, default_processes, run_locust
from loadtest.sweep import run_sweep
from loadtest.workload import builtin_workload_names
from serving.errors import ServingError


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", required=True, help="base URL: the gateway or vLLM itself")
    parser.add_argument(
        "--api-key",
        default=os.environ.get("SERVING_API_KEY"),
        help="bearer key (default: $SERVING_API_KEY)",
    )
    parser.add_argument("--engine-metrics", help="vLLM /metrics URL to scrape during the run")
    parser.add_argument("--gateway-metrics", help="gateway /metrics URL to scrape")
    parser.add_argument(
        "--workload",
        default="short-chat",
        help=f"built-in ({', '.join(builtin_workload_names())}) or a YAML path",
    )
    parser.add_argument("--profile", default="cpu-tiny", help="profile: context, model, targets")
    parser.add_argument("--targets", help="targets YAML (default: loadtest/targets/<profile>.yaml)")
    parser.add_argument("--tokenizer", help="tokenizer dir or hub name (default: the profile's)")
    parser.add_argument("--model", help="model name to request (default: the profile's)")
    parser.add_argument("--out", type=Path, required=True, help="directory for the report")
    parser.add_argument("--scrape-interval", type=float, default=1.0, metavar="SECONDS")


def _load(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--processes",
        type=int,
        default=default_processes(),
        help="Locust processes (default: 1 below 8 cores, else cores/4)",
    )
    parser.add_argument(
        "--no-itl-events",
        action="store_true",
        help="skip per-token ITL entries in Locust's stats (saves CPU)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="one load test, report and verdict")
    _common(run)
    _load(run)
    run.add_argument("--users", type=int, default=4, help="concurrent users (closed loop)")
    run.add_argument("--duration", default="30s", help="e.g. 30s, 2m")
    run.add_argument("--max-requests", type=int, help="stop after this many requests")
    run.add_argument(
        "--step-ramp",
        metavar="START,STEP,SECONDS,STEPS",
        help="ramp users: e.g. 1,2,10s,4 -> 1,3,5,7 users, 10 s each",
    )
    sweep = commands.add_parser("sweep", help="concurrency sweep: the goodput level")
    _common(sweep)
    _load(sweep)
    sweep.add_argument("--levels", default="1,2,4,8", help="users per level, comma-separated")
    sweep.add_argument("--duration", default="30s", help="per level")
    sweep.add_argument("--keep-going", action="store_true", help="run levels after a miss")
    cross = commands.add_parser("crosscheck", help="ours vs vllm bench serve, same workload")
    _common(cross)
    cross.add_argument("--concurrency", type=int, default=4)
    cross.add_argument("--num-prompts", type=int, default=64)
    return parser


def parse_step_ramp(text: str) -> StepRamp:
    parts = text.split(",")
    if len(parts) != 4:
        raise LoadTestError(f"--step-ramp {text!r}: expected START,STEP,SECONDS,STEPS")
    try:
        return StepRamp(
            start_users=int(parts[0]),
            step_users=int(parts[1]),
            step_s=parse_duration(parts[2]),
            steps=int(parts[3]),
        )
    except ValueError as exc:
        raise LoadTestError(f"--step-ramp {text!r}: {exc}") from exc


def _metrics(args: argparse.Namespace) -> dict[str, str]:
    found = {"engine": args.engine_metrics, "gateway": args.gateway_metrics}
    return {source: url for source, url in found.items() if url}


def _meta(args: argparse.Namespace, plan: Plan) -> dict[str, Any]:
    return {
        "command": args.command,
        "host": args.host,
        "workload": plan.workload.name,
        "profile": args.profile,
        "model": plan.model,
        "targets": plan.targets_source,
        "users": getattr(args, "users", None),
        "processes": getattr(args, "processes", 1),
        "prompts": str(plan.prompts_path),
        "tokenizer": plan.tokenizer,
    }


def _template(args: argparse.Namespace, plan: Plan) -> LocustRun:
    return LocustRun(
        host=args.host,
        model=plan.model,
        prompts_path=plan.prompts_path,
        out=args.out,
        duration_s=parse_duration(args.duration),
        processes=max(1, args.processes),
        api_key=args.api_key,
        metrics=_metrics(args),
        scrape_interval_s=args.scrape_interval,
        itl_events=not args.no_itl_events,
    )


def command_run(args: argparse.Namespace, plan: Plan) -> int:
    from dataclasses import replace

    ramp = parse_step_ramp(args.step_ramp) if args.step_ramp else None
    run = replace(
        _template(args, plan), users=args.users, step_ramp=ramp, max_requests=args.max_requests
    )
    report = analyze(run_locust(run), plan.targets, meta=_meta(args, plan))
    json_path, html_path = write_report(report, args.out)
    for warning in report.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    s = report.summary
    print(
        f"{s.succeeded} ok / {s.failed} failed, {s.output_tokens_per_s:,.1f} output tok/s, "
        f"TTFT p50 {s.ttft.p50_ms or 0:,.1f} ms, ITL p50 {s.itl.p50_ms or 0:,.1f} ms"
    )
    print(report.verdict.table())
    print(f"report: {html_path}  (data: {json_path})")
    return 0 if report.verdict.passed else 1


def command_sweep(args: argparse.Namespace, plan: Plan) -> int:
    try:
        levels = sorted({int(level) for level in args.levels.split(",")})
    except ValueError as exc:
        raise LoadTestError(f"--levels {args.levels!r}: {exc}") from exc
    result = run_sweep(
        plan, _template(args, plan), levels, meta=_meta(args, plan), keep_going=args.keep_going
    )
    best = result.goodput
    print(f"goodput: {best.users} users" if best else "goodput: no level met the targets")
    print(f"report: {args.out / 'sweep.html'}")
    return 0 if best else 1


def command_crosscheck(args: argparse.Namespace, plan: Plan) -> int:
    result = run_crosscheck(
        plan,
        base_url=args.host,
        concurrency=args.concurrency,
        num_prompts=args.num_prompts,
        out=args.out,
        api_key=args.api_key,
        metrics=_metrics(args),
        meta=_meta(args, plan),
    )
    print(result.table())
    print(f"result: {args.out / 'crosscheck.json'}")
    return 0 if result.agree else 1


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        plan = make_plan(
            workload=args.workload,
            profile=args.profile,
            out=args.out,
            tokenizer=args.tokenizer,
            model=args.model,
            targets=args.targets,
        )
        handler = {"run": command_run, "sweep": command_sweep, "crosscheck": command_crosscheck}
        return handler[args.command](args, plan)
    except (LoadTestError, ServingError) as exc:
        print(f"loadtest: {exc}", file=sys.stderr)
        return 2
