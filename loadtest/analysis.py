"""Turn a run's raw data (records, scrapes, CPU) into the report: numbers, series, verdict.

The result is plain data (`asdict`-able), written as report.json and rendered as HTML.

Usage: `report = analyze(data, targets, meta={...})`; `report.verdict.passed`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from loadtest import scraper as m
from loadtest.runner import RunData
from loadtest.stats import Series, Summary, summarize, time_series
from loadtest.targets import Measured, Targets, Verdict, evaluate


@dataclass(frozen=True)
class EngineSummary:
    """From the engine's /metrics over the run; None where it was not scraped."""

    scrapes: int
    kv_cache_usage_max: float | None
    kv_cache_usage_mean: float | None
    running_max: float | None
    waiting_max: float | None
    preemptions: float | None
    prompt_tokens: float | None  # counter increase over the run
    generation_tokens: float | None
    prefix_cache_hit_rate: float | None


@dataclass(frozen=True)
class Report:
    meta: dict[str, Any]
    summary: Summary
    engine: EngineSummary
    gateway: dict[str, float]  # counter/gauge increase over the run, per gateway_* series
    cpu: dict[str, Any]
    verdict: Verdict
    series: Series
    metric_series: dict[str, list[tuple[float, float]]]  # "source name" -> (s since start, v)
    warnings: list[str] = field(default_factory=list)


def _increase(points: list[tuple[float, float]]) -> float | None:
    return points[-1][1] - points[0][1] if len(points) >= 2 else None


def engine_summary(data: RunData) -> EngineSummary:
    def series(name: str) -> list[tuple[float, float]]:
        return [
            (s.t, s.values[name]) for s in data.scrapes if s.source == "engine" and name in s.values
        ]

    kv = [v for _, v in series(m.KV_USAGE)]
    running = [v for _, v in series(m.RUNNING)]
    waiting = [v for _, v in series(m.WAITING)]
    hits, queries = _increase(series(m.PREFIX_HITS)), _increase(series(m.PREFIX_QUERIES))
    return EngineSummary(
        scrapes=sum(1 for s in data.scrapes if s.source == "engine"),
        kv_cache_usage_max=max(kv, default=None),
        kv_cache_usage_mean=sum(kv) / len(kv) if kv else None,
        running_max=max(running, default=None),
        waiting_max=max(waiting, default=None),
        preemptions=_increase(series(m.PREEMPTIONS)),
        prompt_tokens=_increase(series(m.PROMPT_TOKENS)),
        generation_tokens=_increase(series(m.GENERATION_TOKENS)),
        prefix_cache_hit_rate=hits / queries if hits is not None and queries else None,
    )


def gateway_summary(data: RunData) -> dict[str, float]:
    scrapes = [s for s in data.scrapes if s.source == "gateway"]
    if len(scrapes) < 2:
        return {}
    first, last = scrapes[0].values, scrapes[-1].values
    return {
        name: value - first.get(name, 0.0)
        for name, value in sorted(last.items())
        if name.startswith(m.GATEWAY_PREFIX)
    }


def analyze(data: RunData, targets: Targets, *, meta: dict[str, Any]) -> Report:
    summary = summarize(data.records)
    engine = engine_summary(data)
    measured = Measured(
        output_tokens_per_s=summary.output_tokens_per_s if summary.succeeded else None,
        ttft_p50_ms=summary.ttft.p50_ms,
        ttft_p99_ms=summary.ttft.p99_ms,
        itl_p50_ms=summary.itl.p50_ms,
        itl_p99_ms=summary.itl.p99_ms,
        kv_cache_usage_max=engine.kv_cache_usage_max,
        preemptions=engine.preemptions,
        error_rate=summary.error_rate if summary.requests else None,
    )
    t0 = data.started
    wanted = {
        "engine": (m.KV_USAGE, m.RUNNING, m.WAITING),
    }
    metric_series = {
        f"{s} {name}": [(t - t0, v) for t, v in _points(data, s, name)]
        for s, names in wanted.items()
        for name in names
    }
    metric_series["loadgen cpu_percent"] = [(t - t0, v) for t, v in data.cpu.samples]
    warnings: list[str] = []
    if data.cpu.bottleneck:
        warnings.append(
            f"load generator CPU-bound: its busiest process averaged "
            f"{data.cpu.max_mean_percent:.0f}% of a core; latencies include its queueing and "
            "the throughput may be its limit, not the server's (use --processes or another host)"
        )
    for source, failed in data.scrape_failures.items():
        warnings.append(f"{failed.count} failed scrapes of {source}: {failed.last}")
    if data.exit_code != 0:
        warnings.append(f"Locust exited with {data.exit_code}; see {data.log}")
    cpu = {
        "processes": data.cpu.processes,
        "max_mean_percent": data.cpu.max_mean_percent,
        "host_mean_percent": data.cpu.host_mean_percent,
        "bottleneck": data.cpu.bottleneck,
    }
    return Report(
        meta=meta,
        summary=summary,
        engine=engine,
        gateway=gateway_summary(data),
        cpu=cpu,
        verdict=evaluate(targets, measured),
        series=time_series(data.records, t0=t0, t1=max(data.ended, data.window[1])),
        metric_series=metric_series,
        warnings=warnings,
    )


def _points(data: RunData, source: str, name: str) -> list[tuple[float, float]]:
    return [(s.t, s.values[name]) for s in data.scrapes if s.source == source and name in s.values]
