"""`python -m loadtest`: run, sweep, crosscheck, memory.

Exit codes: 0 all targets met (or the clients agree, or the measurement agrees with the
memory plan), 1 a target missed (or they disagree), 2 the test could not run (bad input,
unreachable host, Locust failed), 3 the cross-check is inconclusive (a client's middle rounds
spread wider than the tolerance: the machine is too noisy to tell).

Usage:
  python -m loadtest run --host http://127.0.0.1:8000 --api-key sk-... \\
      --engine-metrics http://127.0.0.1:8001/metrics --workload short-chat --users 4 \\
      --duration 30s --out var/loadtest/run
  python -m loadtest sweep ... --levels 1,2,4,8
  python -m loadtest crosscheck --host http://127.0.0.1:8001 --concurrency 4 --num-prompts 128 \\
      --rounds 3 ...
  python -m loadtest memory --profile cpu-tiny-smallkv --host http://127.0.0.1:8001 \\
      --engine-metrics http://127.0.0.1:8001/metrics --out var/loadtest/memory
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from loadtest.analysis import analyze
from loadtest.config import StepRamp, Tenancy, tenant_key_env
from loadtest.crosscheck import run_crosscheck
from loadtest.crosscheck_verdict import TOLERANCE, RoundResult
from loadtest.errors import LoadTestError
from loadtest.memory import run_memory
from loadtest.memory_plan import (
    TOLERANCE_SEQUENCES,
    TOLERANCE_USAGE,
    default_levels,
    keep_exact_prompts,
    predict,
    write_workload,
)
from loadtest.memory_report import markdown_table, write_memory_report
from loadtest.plan import Plan, make_plan, parse_duration
from loadtest.report import write_report
from loadtest.runner import LocustRun, default_processes, run_locust
from loadtest.sweep import run_sweep
from loadtest.workload import builtin_workload_names
from serving.errors import ServingError
from serving.gateway.settings import API_KEY_ENV


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", required=True, help="base URL: the gateway or vLLM itself")
    parser.add_argument(
        "--api-key",
        default=os.environ.get(API_KEY_ENV),
        help=f"bearer key (default: ${API_KEY_ENV})",
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
    cross.add_argument("--num-prompts", type=int, default=128, help="prompts per round")
    cross.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="rounds per client, interleaved (at least 3; from 4, each side's lowest and "
        "highest round are left out of its spread)",
    )
    cross.add_argument(
        "--tolerance", type=float, default=TOLERANCE, help="allowed gap of the medians (0.10: 10%%)"
    )
    memory = commands.add_parser(
        "memory", help="ramp sequences past what the memory plan says fits; plan vs measured"
    )
    _memory_arguments(memory)
    return parser


def _memory_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", required=True, help="base URL: vLLM itself or the gateway")
    parser.add_argument(
        "--api-key",
        default=os.environ.get(API_KEY_ENV),
        help=f"bearer key (default: ${API_KEY_ENV})",
    )
    parser.add_argument("--engine-metrics", required=True, help="vLLM /metrics URL")
    parser.add_argument("--profile", required=True, help="the profile the engine runs")
    parser.add_argument("--tokenizer", help="tokenizer dir or hub name (default: the profile's)")
    parser.add_argument("--model", help="model name to request (default: the profile's)")
    parser.add_argument("--out", type=Path, required=True, help="directory for the report")
    parser.add_argument("--scrape-interval", type=float, default=0.5, metavar="SECONDS")
    parser.add_argument(
        "--levels", help="users per step, comma-separated (default: 1..S+2, S = what fits)"
    )
    parser.add_argument(
        "--blocks-per-sequence",
        type=int,
        help="KV blocks one sequence holds (default: max_model_len // block_size)",
    )
    parser.add_argument(
        "--output-tokens",
        type=int,
        help="output tokens, all sequences (default: block_size/2-16 to block_size-16)",
    )
    parser.add_argument(
        "--min-scrapes", type=int, default=20, help="scrapes a step measures at least"
    )
    parser.add_argument(
        "--turnovers",
        type=int,
        default=2,
        help="a step ends once the engine finished this many requests per user",
    )
    parser.add_argument(
        "--step-timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="longest a step may take to reach its conditions",
    )
    parser.add_argument(
        "--tolerance-sequences",
        type=int,
        default=TOLERANCE_SEQUENCES,
        help="users the waiting point may differ from the plan's",
    )
    parser.add_argument(
        "--tolerance-usage",
        type=float,
        default=TOLERANCE_USAGE,
        help="relative difference allowed for the KV usage plateau (0.05: 5%%)",
    )


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


def _tenants(plan: Plan) -> dict[str, Tenancy]:
    """The workload's tenants, each named one with its key in its variable (else an error
    naming the variable); {} for a workload without tenants."""
    tenants = plan.workload.tenants()
    if set(tenants) == {""}:
        return {}
    for tenant in tenants:
        variable = tenant_key_env(tenant)
        if tenant and not os.environ.get(variable):
            raise LoadTestError(f"workload tenant {tenant!r}: set its key in ${variable}")
    return tenants


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
        tenants=_tenants(plan),
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
    if args.rounds < 3:
        raise LoadTestError(f"--rounds {args.rounds}: a median needs at least 3 rounds a client")

    def progress(r: RoundResult) -> None:
        cpu = "-" if r.cpu_ms_per_request is None else f"{r.cpu_ms_per_request:.2f}"
        print(
            f"round {r.position}/{2 * args.rounds} {r.client} #{r.index}: "
            f"{r.output_tokens_per_s:,.1f} output tok/s, mean TTFT {r.mean_ttft_ms:,.1f} ms, "
            f"client CPU {cpu} ms/request, {r.completed} ok / {r.failed} failed",
            flush=True,
        )

    result = run_crosscheck(
        plan,
        base_url=args.host,
        concurrency=args.concurrency,
        num_prompts=args.num_prompts,
        rounds=args.rounds,
        out=args.out,
        api_key=args.api_key,
        engine_metrics=args.engine_metrics,
        tolerance=args.tolerance,
        meta=_meta(args, plan),
        on_round=progress,
    )
    print(result.verdict.rounds_table())
    print(result.verdict.table())
    print(f"result: {args.out / 'crosscheck.json'}")
    if result.verdict.noisy:
        return 3
    return 0 if result.agree else 1


def command_memory(args: argparse.Namespace) -> int:
    prediction = predict(args.profile, blocks=args.blocks_per_sequence, output=args.output_tokens)
    try:
        levels = (
            sorted({int(level) for level in args.levels.split(",")})
            if args.levels
            else default_levels(prediction.sequences)
        )
    except ValueError as exc:
        raise LoadTestError(f"--levels {args.levels!r}: {exc}") from exc
    if not levels or levels[0] < 1:
        raise LoadTestError(f"--levels {args.levels!r}: users must be >= 1")
    args.out.mkdir(parents=True, exist_ok=True)
    workload = write_workload(prediction, args.out / "workload.yaml")
    plan = make_plan(
        workload=str(workload),
        profile=args.profile,
        out=args.out,
        tokenizer=args.tokenizer,
        model=args.model,
        no_targets=True,
    )
    prompts = keep_exact_prompts(plan.prompts_path, prediction.sizing)
    p = prediction
    print(
        f"plan for {p.profile}: {p.num_blocks} KV blocks of {p.block_size} tokens; a sequence of "
        f"{p.sizing.prompt_tokens}+{p.sizing.output_min}..{p.sizing.output_tokens} tokens holds "
        f"{p.fit.blocks_per_sequence}; {p.sequences} fit ({p.binding}), the "
        f"{p.waiting_from}th waits; KV usage then {p.plateau_usage * 100:.1f}%",
        flush=True,
    )
    template = LocustRun(
        host=args.host,
        model=plan.model,
        prompts_path=plan.prompts_path,
        out=args.out,
        processes=1,
        api_key=args.api_key,
        metrics={"engine": args.engine_metrics},
        scrape_interval_s=args.scrape_interval,
        itl_events=False,
    )
    meta = {
        "command": "memory",
        "host": args.host,
        "profile": args.profile,
        "model": plan.model,
        "levels": ",".join(map(str, levels)),
        "prompts": f"{plan.prompts_path} ({prompts} of them)",
        "tokenizer": plan.tokenizer,
        "a step ends after": f"{args.turnovers} finished requests a user, "
        f"{args.min_scrapes} scrapes at least",
        "scrape interval": f"{args.scrape_interval} s",
    }
    result = run_memory(
        prediction,
        template,
        levels=levels,
        meta=meta,
        engine_metrics=args.engine_metrics,
        min_scrapes=args.min_scrapes,
        turnovers=args.turnovers,
        step_timeout_s=args.step_timeout,
        tolerance_sequences=args.tolerance_sequences,
        tolerance_usage=args.tolerance_usage,
    )
    json_path, html_path = write_memory_report(result, args.out)
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(markdown_table(result))
    print(result.verdict.table())
    print(f"report: {html_path}  (data: {json_path})")
    return 0 if result.verdict.passed else 1


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "memory":
            return command_memory(args)
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
