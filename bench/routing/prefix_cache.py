"""vLLM's prefix cache hit rate over two real engines, per routing path.

    doc = await run_prefix_cache(CacheOptions(paths=CACHE_PATHS, shape=Shape(...)), log)

Two `serving engine` processes (the cpu-tiny profile: prefix caching on, checked in vLLM's own
`vllm:cache_config_info`), every path started in front of both; then, one path at a time:
both engines' prefix caches are emptied (`POST /reset_prefix_cache`), their counters read,
the shared-prefix workload (`workload`) sent through the path, the counters read again. The
hit rate is vLLM's: `vllm:prefix_cache_hits_total` over `vllm:prefix_cache_queries_total`
(both in tokens), summed over the engines. Besides the reset, each path's conversations
start with a line of their own, so no path can hit what an earlier one cached even where a
reset failed silently. Requests per engine (`vllm:request_success_total`) show the balance
each path bought its hit rate with; prompt tokens are checked against the clients' usage.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.gateway_overhead.processes import BenchError, Launcher
from bench.gateway_overhead.real_engine import discover_model
from bench.routing.engines import (
    Engine,
    cache_config,
    read_counters,
    reset_prefix_cache,
    start_engines,
)
from bench.routing.gateway import RoutingUnavailable
from bench.routing.paths import SPECS, Started, start
from bench.routing.router import RouterUnavailable, decisions
from bench.routing.workload import Outcome, Shape, conversations, run_workload

Json = dict[str, object]
CACHE_PATHS = (
    "direct",
    "gw-rr",
    "gw-least",
    "gw-affinity",
    "router-rr",
    "router-ca",
    "router-ch",
)
SETTLE_TIMEOUT_S = 15.0
# Here the direct path is the reference a routing policy is held to: one engine sees every
# turn of every conversation, so no routing finds more in the prefix cache than it does.
LABELS = {"direct": "all to one engine, no proxy (hit rate bound)"}


@dataclass(frozen=True, kw_only=True)
class CacheOptions:
    paths: Sequence[str]
    shape: Shape
    profile: str = "cpu-tiny"
    engines: int = 2


async def run_prefix_cache(options: CacheOptions, log: Callable[[str], None]) -> Json:
    skipped: dict[str, str] = {}
    results: dict[str, Json] = {}
    with (
        tempfile.TemporaryDirectory(prefix="routing-cache-") as tmp,
        Launcher(Path(tmp), pin=False) as launcher,
    ):
        log(f"prefix cache: starting {options.engines} engines ({options.profile}) ...")
        started_at = time.monotonic()
        engines = await start_engines(launcher, count=options.engines, profile=options.profile)
        log(f"engines healthy after {time.monotonic() - started_at:.0f} s")
        model = await discover_model(engines[0].base_url, "")
        config = await cache_config(engines[0])
        if config.get("enable_prefix_caching") != "True":
            raise BenchError(f"{options.profile}: vLLM reports prefix caching off: {config}")
        urls = [engine.base_url for engine in engines]
        outcomes = await asyncio.gather(
            *(start(SPECS[name], launcher, urls, cpu=0, model=model) for name in options.paths),
            return_exceptions=True,
        )
        paths: list[Started] = []
        for name, outcome in zip(options.paths, outcomes, strict=True):
            if isinstance(outcome, Started):
                paths.append(outcome)
            elif isinstance(outcome, RouterUnavailable | RoutingUnavailable):
                skipped[name] = str(outcome)
                log(f"{name} skipped: {outcome}")
            else:
                raise outcome
        for started in paths:
            results[started.path.name] = await _measure(started, engines, options.shape)
            log(f"prefix cache {started.path.name:11} {_brief(results[started.path.name])}")
    direct = results.get("direct", {}).get("hit_rate")
    if isinstance(direct, float) and direct > 0:
        for result in results.values():
            rate = result["hit_rate"]
            result["share_of_one_engine_hit_rate"] = (
                rate / direct if isinstance(rate, float) else None
            )
    return {
        "model": model,
        "profile": options.profile,
        "engines": options.engines,
        "cache_config": config,
        "workload": options.shape.describe(),
        "paths": results,
        "skipped": skipped,
    }


async def _measure(started: Started, engines: Sequence[Engine], shape: Shape) -> Json:
    await asyncio.gather(*(reset_prefix_cache(engine) for engine in engines))
    before = await asyncio.gather(*(read_counters(engine) for engine in engines))
    decided = await _decisions(started)
    convs = conversations(shape, salt=started.path.name)
    outcome = await run_workload(
        started.path.target, convs, concurrency=shape.concurrency, seed=shape.seed
    )
    after = await _settled(engines, before, outcome.ok)
    record = _record(started, engines, before, after, outcome)
    if started.router_metrics is not None:
        now = await _decisions(started)
        record["router_prefix_decisions"] = {
            outcome: count - decided.get(outcome, 0.0)
            for outcome, count in now.items()
            if count != decided.get(outcome, 0.0)
        }
    return record


async def _decisions(started: Started) -> dict[str, float]:
    return {} if started.router_metrics is None else await decisions(started.router_metrics)


async def _settled(
    engines: Sequence[Engine], before: Sequence[Mapping[str, float]], answered: int
) -> list[dict[str, float]]:
    """Counters once the engines have counted every answered request (a response can reach
    the client just before vLLM's metrics record it)."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while True:
        after = await asyncio.gather(*(read_counters(engine) for engine in engines))
        done = sum(a["requests"] - b["requests"] for a, b in zip(after, before, strict=True))
        if done >= answered or time.monotonic() > deadline:
            return list(after)
        await asyncio.sleep(0.25)


def _record(
    started: Started,
    engines: Sequence[Engine],
    before: Sequence[Mapping[str, float]],
    after: Sequence[Mapping[str, float]],
    outcome: Outcome,
) -> Json:
    deltas = {
        engine.name: {key: a[key] - b[key] for key in a}
        for engine, b, a in zip(engines, before, after, strict=True)
    }
    total = {key: sum(c[key] for c in deltas.values()) for key in ("hits", "queries")}
    requests = [c["requests"] for c in deltas.values()]
    engine_prompt_tokens = sum(c["prompt_tokens"] for c in deltas.values())
    per_engine = {
        name: {**counts, "hit_rate": _rate(counts["hits"], counts["queries"])}
        for name, counts in deltas.items()
    }
    return {
        "label": LABELS.get(started.path.name, started.path.label),
        "notes": started.path.notes,
        "hit_rate": _rate(total["hits"], total["queries"]),
        "hits_tokens": total["hits"],
        "queries_tokens": total["queries"],
        "busiest_engine_share": max(requests) / sum(requests) if sum(requests) else None,
        "per_engine": per_engine,
        "requests_ok": outcome.ok,
        "errors": outcome.errors,
        "first_error": outcome.first_error,
        "wall_s": outcome.wall_s,
        "p50_latency_s": statistics.median(outcome.latencies_s) if outcome.latencies_s else None,
        "client_prompt_tokens": sum(outcome.prompt_tokens),
        "engine_prompt_tokens": engine_prompt_tokens,
    }


def _rate(hits: float, queries: float) -> float | None:
    return hits / queries if queries > 0 else None


def _brief(result: Mapping[str, object]) -> str:
    rate, share = result["hit_rate"], result["busiest_engine_share"]
    shown = f"{rate:.1%}" if isinstance(rate, float) else "-"
    busiest = f"{share:.0%}" if isinstance(share, float) else "-"
    errors = f" errors={result['errors']} ({result['first_error']})" if result["errors"] else ""
    return (
        f"hit rate {shown}, busiest engine {busiest} of requests, "
        f"{result['requests_ok']} ok in {result['wall_s']:.1f} s{errors}"
    )
