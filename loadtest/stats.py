"""Statistics of a run from its request records: totals, percentiles, series over time.

Definitions follow vLLM's benchmark client: output throughput is the output tokens of
successful requests over the time from the first request's start to the last one's end;
TTFT, TPOT and end-to-end are per request; ITL percentiles are over every token gap of every
successful request. Percentiles interpolate linearly (numpy's default).

Usage: `summary = summarize(records)`; `series = time_series(records, t0=start)`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from loadtest.records import RequestRecord

PERCENTILES = (50, 90, 99)
# Series get at most this many buckets (wider buckets for longer runs).
MAX_BUCKETS = 120


def percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True)
class Distribution:
    """Milliseconds: mean and percentiles; all None when there were no samples."""

    count: int
    mean_ms: float | None
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None

    @classmethod
    def of(cls, seconds: Sequence[float]) -> Distribution:
        ms = [s * 1000 for s in seconds]
        p50, p90, p99 = (percentile(ms, q) for q in PERCENTILES)
        mean = sum(ms) / len(ms) if ms else None
        return cls(len(ms), mean, p50, p90, p99)


@dataclass(frozen=True)
class Summary:
    requests: int
    succeeded: int
    failed: int
    error_rate: float
    duration_s: float
    request_rate: float
    prompt_tokens: int
    output_tokens: int
    output_tokens_per_s: float
    total_tokens_per_s: float
    ttft: Distribution
    itl: Distribution
    tpot: Distribution
    e2e: Distribution
    errors: dict[str, int] = field(default_factory=dict)


def summarize(records: Sequence[RequestRecord]) -> Summary:
    good = [r for r in records if r.ok]
    failed = len(records) - len(good)
    duration = max(r.end for r in good) - min(r.start for r in good) if good else 0.0
    output = sum(r.output_tokens for r in good)
    prompt = sum(r.prompt_tokens for r in good)
    errors: dict[str, int] = {}
    for record in records:
        if record.error is not None:
            key = record.error[:120]
            errors[key] = errors.get(key, 0) + 1
    per_s = 1 / duration if duration > 0 else 0.0
    return Summary(
        requests=len(records),
        succeeded=len(good),
        failed=failed,
        error_rate=failed / len(records) if records else 0.0,
        duration_s=duration,
        request_rate=len(good) * per_s,
        prompt_tokens=prompt,
        output_tokens=output,
        output_tokens_per_s=output * per_s,
        total_tokens_per_s=(output + prompt) * per_s,
        ttft=Distribution.of([r.ttft_s for r in good if r.ttft_s is not None]),
        itl=Distribution.of([gap for r in good for gap in r.itl_s]),
        tpot=Distribution.of([t for r in good if (t := r.tpot_s) is not None]),
        e2e=Distribution.of([r.e2e_s for r in good if r.e2e_s is not None]),
        errors=dict(sorted(errors.items(), key=lambda item: -item[1])),
    )


@dataclass(frozen=True)
class Series:
    """Values per bucket; `t` is seconds since the run's start (bucket starts)."""

    t: list[float]
    output_tokens_per_s: list[float]
    ttft_p50_ms: list[float | None]
    ttft_p99_ms: list[float | None]
    itl_p50_ms: list[float | None]
    itl_p99_ms: list[float | None]
    errors: list[int]


def bucket_width(span_s: float) -> float:
    """1 s buckets, or wider so a long run has at most MAX_BUCKETS."""
    return max(1.0, math.ceil(span_s / MAX_BUCKETS))


def _token_times(record: RequestRecord) -> list[float]:
    if record.ttft_s is None:
        return []
    times = [record.start + record.ttft_s]
    for gap in record.itl_s:
        times.append(times[-1] + gap)
    return times


def time_series(records: Iterable[RequestRecord], *, t0: float, t1: float) -> Series:
    """Throughput from token arrival times; TTFT by first-token time; ITL by gap time."""
    width = bucket_width(t1 - t0)
    count = max(1, math.ceil((t1 - t0) / width))
    tokens = [0.0] * count
    ttfts: list[list[float]] = [[] for _ in range(count)]
    itls: list[list[float]] = [[] for _ in range(count)]
    errors = [0] * count

    def slot(t: float) -> int:
        return min(count - 1, max(0, int((t - t0) // width)))

    for record in records:
        if not record.ok:
            errors[slot(record.end)] += 1
            continue
        times = _token_times(record)
        if not times:
            continue
        share = record.output_tokens / len(times)
        for t in times:
            tokens[slot(t)] += share
        ttfts[slot(times[0])].append((record.ttft_s or 0.0) * 1000)
        for t, gap in zip(times[1:], record.itl_s, strict=True):
            itls[slot(t)].append(gap * 1000)
    return Series(
        t=[i * width for i in range(count)],
        output_tokens_per_s=[n / width for n in tokens],
        ttft_p50_ms=[percentile(v, 50) for v in ttfts],
        ttft_p99_ms=[percentile(v, 99) for v in ttfts],
        itl_p50_ms=[percentile(v, 50) for v in itls],
        itl_p99_ms=[percentile(v, 99) for v in itls],
        errors=errors,
    )
