"""What routing costs in front of fast engines: two fake upstreams, the routing paths in
front of them, the gateway overhead benchmark's load generator and interleaved rounds.

    doc = await run_overhead(OverheadOptions(paths=("router-ca", "gw-affinity"), plan=plan), log)

Two instances of `bench.gateway_overhead.upstream` and the load generator (this process)
share core 0; every proxy process gets core 1, and the gateway and the router of the
`gw-router` stack share it (one machine runs that stack). The CPU of each proxy process is
read from /proc around each measurement; per request it is the comparison least disturbed by
other load on the machine, and 1 / (CPU per request) is the requests/s one core sustains.
"""

from __future__ import annotations

import asyncio
import math
import statistics
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.gateway_overhead import report
from bench.gateway_overhead.load import MACHINE, Sample, Target
from bench.gateway_overhead.paths import (
    LOAD_CPU,
    PROXY_CPU,
    READY_TIMEOUT_S,
    REPO_ROOT,
    PathUnderTest,
)
from bench.gateway_overhead.processes import BenchError, Launcher, can_pin, free_port, pin_self
from bench.gateway_overhead.runner import JSON, STREAM, Plan, run_rounds
from bench.gateway_overhead.upstream import MODEL
from bench.routing.gateway import RoutingUnavailable
from bench.routing.paths import SPECS, Started, start
from bench.routing.router import RouterUnavailable

Json = dict[str, object]
DEFAULT_PATHS = ("gateway", "router-rr", "router-ca", "gw-affinity", "gw-least", "gw-router")
PROXY = "proxy"
UPSTREAM = "upstream"


@dataclass(frozen=True, kw_only=True)
class OverheadOptions:
    paths: Sequence[str]
    """Paths besides direct (always measured: the baseline)."""
    plan: Plan
    upstreams: int = 2


async def start_upstreams(launcher: Launcher, count: int) -> list[str]:
    urls = []
    for index in range(count):
        port = free_port()
        argv = [sys.executable, "-m", "bench.gateway_overhead.upstream", "--port", str(port)]
        launcher.start(f"{UPSTREAM}-{index}", argv, cpu=LOAD_CPU, cwd=REPO_ROOT)
        urls.append(f"http://127.0.0.1:{port}")
    for index, url in enumerate(urls):
        target = Target(base_url=url, api_key="sk-direct", model=MODEL)
        await launcher.wait_ready(f"{UPSTREAM}-{index}", target, timeout_s=READY_TIMEOUT_S)
    return urls


async def run_overhead(options: OverheadOptions, log: Callable[[str], None]) -> Json:
    pin = can_pin()
    if pin:
        pin_self(LOAD_CPU)
    skipped: dict[str, str] = {}
    with (
        tempfile.TemporaryDirectory(prefix="routing-overhead-") as tmp,
        Launcher(Path(tmp), pin=pin) as launcher,
    ):
        log(f"overhead: starting {options.upstreams} upstreams and {', '.join(options.paths)} ...")
        upstreams = await start_upstreams(launcher, options.upstreams)
        outcomes = await asyncio.gather(
            *(
                start(SPECS[name], launcher, upstreams, cpu=PROXY_CPU, model=MODEL)
                for name in options.paths
            ),
            return_exceptions=True,
        )
        direct = await start(SPECS["direct"], launcher, upstreams, cpu=PROXY_CPU, model=MODEL)
        started: list[Started] = [direct]
        for name, outcome in zip(options.paths, outcomes, strict=True):
            if isinstance(outcome, Started):
                started.append(outcome)
            elif isinstance(outcome, RouterUnavailable | RoutingUnavailable):
                skipped[name] = str(outcome)
                log(f"{name} skipped: {outcome}")
            else:
                raise outcome
        upstream_pids = [pid for i in range(options.upstreams) for pid in _pids(launcher, i)]
        roles = {s.path.name: s.processes for s in started}

        def cpu_groups(path: PathUnderTest) -> Mapping[str, Sequence[int]]:
            groups: dict[str, Sequence[int]] = {UPSTREAM: upstream_pids}
            proxy_pids: list[int] = []
            for role, name in roles[path.name].items():
                groups[role] = launcher.pids(name)
                proxy_pids.extend(groups[role])
            if proxy_pids:
                groups[PROXY] = proxy_pids
            return groups

        samples = await run_rounds(
            [s.path for s in started], options.plan, cpu_groups=cpu_groups, log=log
        )
    summaries = {
        s.path.name: summarise(samples[s.path.name], roles=tuple(s.processes)) for s in started
    }
    doc: Json = {
        "plan": options.plan.describe(),
        "pinning": (
            f"proxies on core {PROXY_CPU}; the {options.upstreams} upstreams and the load "
            f"generator on core {LOAD_CPU}"
            if pin
            else "not pinned (fewer than 2 cores or no taskset)"
        ),
        "paths": {
            s.path.name: {
                "label": s.path.label,
                "notes": s.path.notes,
                "processes": sorted(s.processes),
                "summary": summaries[s.path.name],
                "runs": {
                    metric: [report.sample_record(sample) for sample in runs]
                    for metric, runs in samples[s.path.name].items()
                },
            }
            for s in started
        },
        "skipped": skipped,
        "ratios": ratios(summaries),
        "notes": _notes(samples),
    }
    return doc


def _notes(samples: Mapping[str, Mapping[str, Sequence[Sample]]]) -> list[str]:
    """How busy the machine was with processes other than the measured ones."""
    foreign = [
        s.cpu_share[MACHINE] - sum(v for k, v in s.cpu_share.items() if k not in (MACHINE, PROXY))
        for per_metric in samples.values()
        for runs in per_metric.values()
        for s in runs
        if MACHINE in s.cpu_share
    ]
    if not foreign:
        return []
    other = max(0.0, statistics.median(foreign))
    return [
        f"other processes on the machine used a median {other:.0%} of a core during the "
        "measurements (0% on an idle machine); they took CPU from every path alike "
        "(interleaved rounds), and CPU per request is the comparison least affected by them"
    ]


def _pids(launcher: Launcher, index: int) -> tuple[int, ...]:
    return launcher.pids(f"{UPSTREAM}-{index}")


def summarise(per_metric: Mapping[str, Sequence[Sample]], *, roles: Sequence[str]) -> Json:
    """The gateway overhead benchmark's medians, plus CPU per request and per stream of each
    proxy process, and what one core of them sustains."""
    summary: Json = dict(report.summarise(per_metric))
    for role in (PROXY, *roles) if roles else ():
        for metric, unit in ((JSON, "req"), (STREAM, "stream")):
            cost = _median(
                [
                    s.cpu_share[role] / s.per_second * 1e6
                    for s in per_metric[metric]
                    if s.ok and role in s.cpu_share
                ]
            )
            summary[f"{role}_cpu_us_per_{unit}"] = cost
            summary[f"{role}_{unit}_per_s_per_core"] = 1e6 / cost if cost > 0 else math.nan
    return summary


def _median(values: Sequence[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return statistics.median(finite) if finite else math.nan


def ratios(summaries: Mapping[str, Mapping[str, object]]) -> dict[str, dict[str, float]]:
    """Latency added to direct; and the comparisons the routing decision rests on: each
    routing path against the gateway without routing, and the gateway-plus-router stack
    against the gateway routing by itself."""
    out: dict[str, dict[str, float]] = {}
    direct = summaries.get("direct")
    base = summaries.get("gateway")
    for name, s in summaries.items():
        r: dict[str, float] = {}
        if direct is not None and name != "direct":
            r["added_p50_ms"] = _f(s, "p50_ms") - _f(direct, "p50_ms")
            r["added_p99_ms"] = _f(s, "p99_ms") - _f(direct, "p99_ms")
        if base is not None and name not in ("direct", "gateway"):
            r["added_p50_ms_vs_gateway"] = _f(s, "p50_ms") - _f(base, "p50_ms")
            r["proxy_cpu_us_per_req_vs_gateway"] = _f(s, "proxy_cpu_us_per_req") - _f(
                base, "proxy_cpu_us_per_req"
            )
        out[name] = r
    stack = summaries.get("gw-router")
    for name in ("gw-affinity", "gw-least"):
        ours = summaries.get(name)
        if stack is None or ours is None:
            continue
        out[name] |= {
            "req_per_s_vs_gw_router": _div(_f(ours, "req_per_s"), _f(stack, "req_per_s")),
            "streams_per_s_vs_gw_router": _div(
                _f(ours, "streams_per_s"), _f(stack, "streams_per_s")
            ),
            "proxy_cpu_per_req_vs_gw_router": _div(
                _f(ours, "proxy_cpu_us_per_req"), _f(stack, "proxy_cpu_us_per_req")
            ),
            "p50_ms_vs_gw_router": _f(ours, "p50_ms") - _f(stack, "p50_ms"),
        }
    return out


def _f(summary: Mapping[str, object], key: str) -> float:
    value = summary.get(key)
    return float(value) if isinstance(value, int | float) else math.nan


def _div(a: float, b: float) -> float:
    return a / b if b > 0 and not math.isnan(a) else math.nan


def check_paths(names: Sequence[str]) -> None:
    unknown = [name for name in names if name not in SPECS or name == "direct"]
    if unknown:
        choices = ", ".join(n for n in SPECS if n != "direct")
        raise BenchError(f"--paths: unknown {unknown} (choose from {choices})")
