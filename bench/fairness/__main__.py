"""Command line of the fair sharing benchmark (see the package docstring)."""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import aiohttp

from bench.command import run_benchmark
from bench.fairness.load import QuietResult, Tenant, metrics, noisy_load, quiet_load
from bench.fairness.replicas import (
    REPLICA_SETTINGS,
    REPLICAS,
    Replicas,
    report_lines,
    start_replicas,
)
from bench.gateway_overhead.paths import READY_TIMEOUT_S, REPO_ROOT, create_key, serving_argv
from bench.gateway_overhead.processes import BenchError, Launcher, can_pin, free_port, pin_self
from bench.gateway_overhead.report import write_results
from bench.results_files import RESULTS_DIR, loadavg, machine, machine_lines
from bench.routing.engines import Engine, start_engines
from loadtest.scraper import GENERATION_TOKENS, RUNNING, WAITING
from serving.gateway.setting_names import flag_name
from serving.gateway.settings import GatewaySettings
from serving.models.tiny_model import MODEL_NAME as MODEL
from serving.stack_engines import gateway_engine_settings

STEM = "fairness"
PROFILE = "cpu-tiny"
GATEWAY_CPU = 1
IDLE_TIMEOUT_S = 120.0
GOAL = {"median": 2.0, "worst": 3.0, "throughput": 0.9}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.fairness",
        description="A quiet key's TTFT under a noisy key's flood: vLLM's FCFS vs fair sharing.",
    )
    parser.add_argument("--seconds", type=float, default=20.0, help="quiet load per setting")
    parser.add_argument("--runs", type=int, default=3, help="runs in a row (medians)")
    parser.add_argument("--quiet-rate", type=float, default=2.0, help="quiet requests per s")
    parser.add_argument(
        "--noisy-streams",
        default="16,32,64",
        help="floods: noisy streams kept going, comma-separated (default: %(default)s, 1x, 2x "
        "and 4x cpu-tiny's 16 slots)",
    )
    parser.add_argument(
        "--reserved",
        default="1",
        help="--reserved-slots of the fair gateways, comma-separated (default: %(default)s)",
    )
    parser.add_argument(
        "--replicas",
        type=int,
        choices=(0, REPLICAS),
        default=REPLICAS,
        help="fair gateway replicas on one Redis, with the first --reserved, measured too "
        "(the flood through one and through both); 0 leaves them out (default: %(default)s)",
    )
    parser.add_argument(
        "--output-dir",
        type=Path,
        default=RESULTS_DIR,
        help="results go to DIR/fairness/<date>.json and .md (default: bench/results)",
    )
    return parser


async def _wait_idle(engine: Engine) -> None:
    deadline = time.monotonic() + IDLE_TIMEOUT_S
    while time.monotonic() < deadline:
        values = await metrics(engine.base_url)
        if values.get(RUNNING, 0) == 0 and values.get(WAITING, 0) == 0:
            return
        await asyncio.sleep(0.5)
    raise BenchError(f"the engine did not go idle within {IDLE_TIMEOUT_S:.0f} s")


async def _start_gateway(
    launcher: Launcher, name: str, engine: Engine, keys_db: Path, flags: Sequence[str]
) -> str:
    port = free_port()
    argv = serving_argv("gateway", "--upstream", engine.base_url, "--port", str(port),
                    "--keys-db", str(keys_db), "--drain-delay", "0", *flags)  # fmt: skip
    launcher.start(name, argv, cpu=GATEWAY_CPU, cwd=REPO_ROOT)
    url = f"http://127.0.0.1:{port}"

    async def ready() -> str | None:
        try:
            async with aiohttp.ClientSession() as session, session.get(url + "/readyz") as r:
                return None if r.status == 200 else f"/readyz {r.status}"
        except aiohttp.ClientError as exc:
            return str(exc)

    await launcher.wait_until(name, ready, timeout_s=READY_TIMEOUT_S)
    return url


def _summary(result: QuietResult) -> dict[str, float]:
    ttft = sorted(result.ttft_s)
    if not ttft:
        return {"n": 0}
    p99 = ttft[min(len(ttft) - 1, max(0, round(0.99 * len(ttft)) - 1))]
    return {
        "n": len(ttft),
        "median_ms": statistics.median(ttft) * 1000,
        "p99_ms": p99 * 1000,
        "worst_ms": ttft[-1] * 1000,
    }


async def _measure(
    engine: Engine,
    urls: tuple[Sequence[str], Sequence[str]],
    keys: dict[str, str],
    args: argparse.Namespace,
    *,
    noisy: int,
) -> dict[str, object]:
    """The quiet key's load, alone (`noisy` 0) or beside that many streams; `urls`: the
    gateways of the quiet requests (in turn) and of the noisy streams (split evenly)."""
    quiet = [Tenant(url, keys["quiet"], MODEL) for url in urls[0]]
    flood = [Tenant(url, keys["noisy"], MODEL) for url in urls[1]]
    await _wait_idle(engine)
    if not noisy:
        before = await metrics(engine.base_url)
        started = time.perf_counter()
        result = await quiet_load(quiet, rate_per_s=args.quiet_rate, seconds=args.seconds)
        errors: list[str] = []
    else:
        async with noisy_load(flood, streams=noisy) as errors:
            await asyncio.sleep(5)  # the flood fills the engine (and the gateway's queue)
            before = await metrics(engine.base_url)
            started = time.perf_counter()
            result = await quiet_load(quiet, rate_per_s=args.quiet_rate, seconds=args.seconds)
            after = await metrics(engine.base_url)
            elapsed = time.perf_counter() - started
    if not noisy:
        after = await metrics(engine.base_url)
        elapsed = time.perf_counter() - started
    generated = after.get(GENERATION_TOKENS, 0) - before.get(GENERATION_TOKENS, 0)
    return {
        **_summary(result),
        "tokens_per_s": generated / elapsed,
        "quiet_errors": result.errors[:3],
        "noisy_errors": len(errors),
    }


async def run(args: argparse.Namespace) -> dict[str, object]:
    if can_pin():
        pin_self(GATEWAY_CPU)
    from serving.profiles import load_profile

    profile = load_profile(PROFILE)
    slots = profile.max_num_seqs
    reserved = [int(value) for value in args.reserved.split(",") if value]
    floods = [int(value) for value in args.noisy_streams.split(",") if value]
    for value in reserved:
        GatewaySettings.create(
            upstream="http://x:1", api_keys=["k"], engine_slots=slots, reserved_slots=value
        )  # fmt: skip  (a bad value fails here)

    def engine_flags(scheduling: str) -> list[str]:
        # What `serving up` tells its gateway of the engine (its slots, the queue policy, the
        # profile's tokens per stream event): every gateway here is told the same. With
        # `fcfs` the slots make no queue: vLLM's own order, as without them.
        told = gateway_engine_settings(profile, scheduling)
        return [part for name, value in told.items() for part in (flag_name(name), str(value))]

    fair = {value: [*engine_flags("fair"), "--reserved-slots", str(value)] for value in reserved}
    settings = {"fcfs": engine_flags("fcfs")}
    settings.update({f"fair, {value} reserved": flags for value, flags in fair.items()})
    runs: list[dict[str, dict[str, object]]] = []
    replicas: Replicas | None = None
    with (
        tempfile.TemporaryDirectory(prefix="fairness-") as tmp,
        Launcher(Path(tmp), pin=can_pin()) as launcher,
    ):
        gateways = len(settings) + args.replicas
        print(f"starting a {PROFILE} engine and {gateways} gateways ...", flush=True)
        (engine,) = await start_engines(launcher, count=1, profile=PROFILE)
        keys_db = Path(tmp) / "keys.db"
        keys = {name: create_key(keys_db, name) for name in ("quiet", "noisy")}
        # Each setting's gateways: those of the quiet requests, those of the noisy streams.
        routes: dict[str, tuple[Sequence[str], Sequence[str]]] = {}
        for index, (name, flags) in enumerate(settings.items()):
            url = await _start_gateway(launcher, f"gw-{index}", engine, keys_db, flags)
            routes[name] = ([url], [url])
        if args.replicas and reserved:
            replicas = await start_replicas(
                launcher,
                lambda name, flags: _start_gateway(launcher, name, engine, keys_db, flags),
                fair[reserved[0]],
                cpu=GATEWAY_CPU,
            )
            routes.update(replicas.routes())
            settings.update({name: list(replicas.flags) for name in replicas.routes()})
        for number in range(1, args.runs + 1):
            measured: dict[str, dict[str, object]] = {}
            measured["alone"] = await _measure(engine, routes["fcfs"], keys, args, noisy=0)
            print(f"run {number}: alone {measured['alone']}", flush=True)
            for flood in floods:
                for name, urls in routes.items():
                    row = _row(name, flood)
                    result = await _measure(engine, urls, keys, args, noisy=flood)
                    if replicas is not None and name in REPLICA_SETTINGS:
                        # Read after the flood: 0 on either would mean Redis was away and
                        # each replica ran its own part, not the shared slots.
                        result["shared_up"] = await replicas.shared()
                    measured[row] = {**result, "setting": name, "flood": flood}
                    print(f"run {number}: {row} {measured[row]}", flush=True)
            runs.append(measured)
    return {
        "benchmark": STEM,
        "created": datetime.now(UTC).replace(microsecond=0).isoformat(),
        "command": "python -m bench.fairness " + " ".join(sys.argv[1:]),
        "machine": {**machine(), "loadavg_after": loadavg()},
        "plan": {
            "seconds": args.seconds,
            "runs": args.runs,
            "quiet_rate": args.quiet_rate,
            "noisy_streams": floods,
            "engine_slots": slots,
            "stream_interval": profile.stream_interval,
            "quiet_max_tokens": 16,
            "noisy_max_tokens": 256,
            "replicas": len(replicas.urls) if replicas else 0,
            "replica_reserved_slots": reserved[0] if replicas else None,
            "redis": replicas.redis.version if replicas else None,
        },
        "settings": settings,
        "runs": runs,
    }


def _row(setting: str, flood: int) -> str:
    return f"{setting}, {flood} streams"


def _fcfs_beside(run: dict[str, dict[str, object]], name: str) -> str:
    """The FCFS row under the same flood as `name` (alone: itself)."""
    flood = run[name].get("flood")
    return _row("fcfs", flood) if isinstance(flood, int) and flood else name


def _ratio(value: object, base: object) -> float:
    return float(value) / float(base) if isinstance(value, int | float) and base else float("nan")  # type: ignore[arg-type]


def report(doc: dict[str, object]) -> str:
    runs = doc["runs"]
    assert isinstance(runs, list)
    names = list(runs[0])
    lines = [
        "# Fair sharing benchmark", "",
        f"`{doc['command']}` at {doc['created']}; plan: {json.dumps(doc['plan'])}.", "",
        *machine_lines(doc["machine"]),
        "The quiet key's time to first token (median and worst of each run's requests; the",
        "JSON file has the p99 too, which at a few dozen requests a run is the worst) and",
        "vLLM's generated tokens/s while it ran, alone and under each flood (noisy streams kept",
        "going). Ratios: against the quiet key alone in the same run (TTFT: median against",
        "median, worst against worst), against FCFS under the same flood in the same run",
        "(tokens/s). Goal: median <= 2x alone, worst <= 3x, tokens/s >= 90% of FCFS, in every",
        "run.", "",
        *report_lines(runs),
        "| setting | TTFT median ms (runs) | x alone | TTFT worst ms (runs) | x alone "
        "| tokens/s | x FCFS |",
        "|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for name in names:
        fcfs = _fcfs_beside(runs[0], name)
        cells = [f"| {name} "]
        for field in ("median_ms", "worst_ms"):
            values = [run[name].get(field, float("nan")) for run in runs]
            ratios = [_ratio(run[name].get(field), run["alone"].get(field)) for run in runs]
            cells.append(
                f"| {statistics.median(values):.0f} ({', '.join(f'{v:.0f}' for v in values)}) "
                f"| {statistics.median(ratios):.2f}x (worst run {max(ratios):.2f}x) "
            )
        tps = [run[name]["tokens_per_s"] for run in runs]
        tps_x = [_ratio(run[name]["tokens_per_s"], run[fcfs]["tokens_per_s"]) for run in runs]
        cells.append(f"| {statistics.median(tps):.0f} | {statistics.median(tps_x):.0%} |")
        lines.append("".join(cells))
    lines += ["", *verdicts(runs)]
    return "\n".join(lines) + "\n"


def verdicts(runs: list[dict[str, dict[str, object]]]) -> list[str]:
    """The goal on the quiet key under each fair flood, run by run."""
    lines = ["| fair setting | median <= 2x alone | worst <= 3x alone | tokens/s >= 90% FCFS |",
             "|---|---|---|---|"]  # fmt: skip
    for name, row in runs[0].items():
        if row.get("setting") in (None, "fcfs"):
            continue
        fcfs = _fcfs_beside(runs[0], name)
        checks = [
            [_ratio(run[name].get(field), run["alone"].get(field)) <= GOAL[goal] for run in runs]
            for field, goal in (("median_ms", "median"), ("worst_ms", "worst"))
        ]
        checks.append(
            [
                _ratio(run[name]["tokens_per_s"], run[fcfs]["tokens_per_s"]) >= GOAL["throughput"]
                for run in runs
            ]
        )
        cells = [f"{sum(held)}/{len(held)} runs" + ("" if all(held) else " **MISS**")
                 for held in checks]  # fmt: skip
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        floods = [int(value) for value in args.noisy_streams.split(",")]
    except ValueError:
        floods = []
    if args.runs < 1 or args.seconds <= 0 or args.quiet_rate <= 0 or min(floods, default=0) < 1:
        print("--runs, --seconds, --quiet-rate, --noisy-streams: must be positive", file=sys.stderr)
        return 2
    return run_benchmark("bench.fairness", measure_and_report(args))


async def measure_and_report(args: argparse.Namespace) -> int:
    doc = await run(args)
    text = report(doc)
    write_results(doc, args.output_dir, STEM, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
