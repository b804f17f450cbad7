"""The local benchmark: fast upstream, the paths in front of it, interleaved rounds, results.

    doc = await run_local(LocalOptions(paths=("passthrough", "gateway"), plan=plan, ...), print)

The load generator (this process) and the upstream share core 0; each proxy gets core 1 to
itself (the Redis of the gateway-redis path runs on core 0: `paths.REDIS_CPU`). Every process
is started here and stopped on the way out, whatever happens.
"""

from __future__ import annotations

import asyncio
import os
import platform
import statistics
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from bench.gateway_overhead import report
from bench.gateway_overhead.litellm_proxy import LiteLLMUnavailable
from bench.gateway_overhead.load import MACHINE, Sample
from bench.gateway_overhead.paths import (
    GATEWAY_REDIS,
    LOAD_CPU,
    PROXY_CPU,
    REDIS_CPU,
    REDIS_PROCESS,
    PathUnderTest,
    start_path,
    start_upstream,
)
from bench.gateway_overhead.pieces import measure_pieces
from bench.gateway_overhead.processes import BenchError, Launcher, can_pin, pin_self
from bench.gateway_overhead.profile import ProfileSummary, profile_process
from bench.gateway_overhead.redis_server import RedisUnavailable
from bench.gateway_overhead.runner import JSON, STREAM, Plan, measure_metric, run_rounds

Json = dict[str, object]
PROFILE_MODES = ("auto", "always", "never")


@dataclass(frozen=True, kw_only=True)
class LocalOptions:
    paths: Sequence[str]
    """Paths besides direct (always measured: it is the baseline)."""
    plan: Plan
    profile: str = "auto"
    """`auto`: profile the gateway when a target is missed (and the gateway with the Redis
    store when one of its targets is); `always`; `never`."""
    profile_seconds: float = 6.0
    command: str = ""


async def run_local(options: LocalOptions, log: Callable[[str], None]) -> Json:
    pin = can_pin()
    if pin:
        pin_self(LOAD_CPU)
    loadavg_before = _loadavg()
    skipped: dict[str, str] = {}
    with (
        tempfile.TemporaryDirectory(prefix="gateway-overhead-") as tmp,
        Launcher(Path(tmp), pin=pin) as launcher,
    ):
        log(f"starting the upstream and {', '.join(options.paths) or 'no proxies'} ...")
        paths = [await start_upstream(launcher)]
        upstream = paths[0].target.base_url
        started = await asyncio.gather(
            *(start_path(name, launcher, upstream) for name in options.paths),
            return_exceptions=True,
        )
        for name, outcome in zip(options.paths, started, strict=True):
            if isinstance(outcome, PathUnderTest):
                paths.append(outcome)
            elif (name == "litellm" and isinstance(outcome, LiteLLMUnavailable | BenchError)) or (
                isinstance(outcome, RedisUnavailable)
            ):
                skipped[name] = str(outcome)
                log(f"{name} skipped: {outcome}")
            else:
                raise outcome

        def cpu_groups(path: PathUnderTest) -> Mapping[str, Sequence[int]]:
            groups = {"upstream": launcher.pids("upstream")}
            if path.process is not None:
                groups["proxy"] = launcher.pids(path.process)
            if path.redis is not None:
                groups[REDIS_PROCESS] = launcher.pids(REDIS_PROCESS)
            return groups

        samples = await run_rounds(paths, options.plan, cpu_groups=cpu_groups, log=log)
        summaries = {p.name: report.summarise(samples[p.name]) for p in paths}
        ratios = report.ratios(summaries)
        targets = report.local_targets(ratios)
        redis_targets = report.redis_targets(
            ratios, summaries.get(GATEWAY_REDIS, {}).get("redis_round_trips_per_req")
        )
        profiles: dict[str, ProfileSummary] = {}
        for name, its_targets in (("gateway", targets), (GATEWAY_REDIS, redis_targets)):
            path = next((p for p in paths if p.name == name), None)
            wanted = options.profile == "always" or (
                options.profile == "auto" and report.missed(its_targets)
            )
            if path is not None and wanted:
                log(f"profiling {name} under load ...")
                profiles[name] = await _profile(path, launcher, options)
    pieces = measure_pieces() if "gateway" in summaries else {}  # its processes are gone
    loadavg_after = _loadavg()
    all_samples = [s for per_metric in samples.values() for run in per_metric.values() for s in run]
    doc: Json = {
        "benchmark": "gateway_overhead",
        "mode": "local",
        "created": datetime.now(UTC).replace(microsecond=0).isoformat(),
        "command": options.command,
        "machine": {
            "cpus": os.cpu_count(),
            "cpu_model": _cpu_model(),
            "python": platform.python_version(),
            "pinning": (
                f"proxy on core {PROXY_CPU}, upstream and load generator on core {LOAD_CPU}"
                + (
                    f", the Redis store's redis-server on core {REDIS_CPU}"
                    if any(p.redis is not None for p in paths)
                    else ""
                )
                if pin
                else "not pinned (fewer than 2 cores or no taskset)"
            ),
            "loadavg_before": loadavg_before,
            "loadavg_after": loadavg_after,
        },
        "plan": options.plan.describe(),
        "paths": {
            p.name: {
                "label": p.label,
                "notes": p.notes,
                "summary": summaries[p.name],
                "runs": {
                    metric: [report.sample_record(s) for s in runs]
                    for metric, runs in samples[p.name].items()
                },
                **(
                    {"redis_commands": report.commands_by_name(samples[p.name])}
                    if p.redis is not None
                    else {}
                ),
            }
            for p in paths
        },
        "skipped": skipped,
        "ratios": ratios,
        "targets": [*targets, *redis_targets],
        "notes": _notes(all_samples, summaries),
        "pieces": pieces,
        "profile": profiles.get("gateway"),
        "profile_redis": profiles.get(GATEWAY_REDIS),
    }
    cleaned = report.clean(doc)
    assert isinstance(cleaned, dict)
    return cleaned


async def _profile(
    gateway: PathUnderTest, launcher: Launcher, options: LocalOptions
) -> ProfileSummary:
    """py-spy on the path's proxy process while it serves JSON requests, then streams."""
    assert gateway.process is not None
    half = options.profile_seconds / 2

    async def load() -> None:
        await measure_metric(JSON, gateway, options.plan, seconds=half)
        await measure_metric(STREAM, gateway, options.plan, seconds=half)

    return await profile_process(
        launcher.pid(gateway.process),
        seconds=options.profile_seconds + 1,
        load=load,
        workdir=launcher.workdir,
        name=gateway.process,
    )


def _notes(samples: Sequence[Sample], summaries: Mapping[str, Mapping[str, float]]) -> list[str]:
    notes = []
    foreign = [
        s.cpu_share[MACHINE] - sum(v for k, v in s.cpu_share.items() if k != MACHINE)
        for s in samples
        if MACHINE in s.cpu_share
    ]
    if foreign:
        other = max(0.0, statistics.median(foreign))
        notes.append(
            f"other processes on the machine used a median {other:.0%} of a core during the "
            "measurements (0% on an idle machine)"
            + (
                ": they took CPU from every path alike (interleaved), so the ratios hold "
                "better than the absolute numbers; one-at-a-time p99 then mostly measures "
                "scheduling delays, and the proxy CPU per request is the comparison least "
                "affected by them"
                if other > 0.25
                else ""
            )
        )
    direct = summaries.get("direct")
    if direct is not None and direct["loadgen_cpu_json"] > 0.8:
        notes.append(
            f"direct req/s is bound by the load generator (core {LOAD_CPU} "
            f"{direct['loadgen_cpu_json']:.0%} busy with it); proxies whose core is near "
            "100% busy are bound by their own CPU, so their req/s is per proxy core"
        )
    redis = summaries.get(GATEWAY_REDIS)
    if redis is not None:
        core = redis["loadgen_cpu_json"] + redis["upstream_cpu_json"] + redis["redis_cpu_json"]
        notes.append(
            f"{GATEWAY_REDIS}: core {REDIS_CPU} (load generator, upstream and Redis) was a "
            f"median {core:.0%} busy during its req/s runs, Redis's share "
            f"{redis['redis_cpu_json']:.0%}"
            + (
                "; near 100%, so its req/s may be bound by that core rather than the "
                "gateway's: compare proxy CPU per request too"
                if core > 0.9
                else ""
            )
        )
    bad = [name for name, s in summaries.items() if s["errors"]]
    if bad:
        notes.append(f"errors on: {', '.join(bad)} (see runs[].first_error in the JSON)")
    return notes


def _loadavg() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"
