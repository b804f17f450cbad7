"""Interleaved measurement rounds: every path, every metric, `runs` times.

    samples = await run_rounds(paths, plan, cpu_groups=groups_of, log=print)
    samples["gateway"]["json"]          # one Sample per run

Within a round each metric is measured on every path back to back, and the order of the
paths rotates from round to round, so a burst of noise on the machine hits all paths alike
instead of one. Medians over the rounds are taken by `report`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from bench.gateway_overhead.load import WARM_S, Sample, measure
from bench.gateway_overhead.paths import PathUnderTest
from bench.gateway_overhead.redis_server import ROUND_TRIPS, delta

LATENCY = "latency"
JSON = "json"
STREAM = "stream"
METRICS = (LATENCY, JSON, STREAM)
Samples = dict[str, dict[str, list[Sample]]]
CpuGroups = Callable[[PathUnderTest], Mapping[str, Sequence[int]]]


@dataclass(frozen=True, kw_only=True)
class Plan:
    """How long and how hard: `Plan(seconds=4, runs=3, concurrency=32)`."""

    seconds: float
    runs: int
    concurrency: int
    warmup_s: float = 1.0
    warm_s: float = WARM_S
    """Each measurement's own warm-up before its window opens."""

    def describe(self) -> dict[str, float]:
        return {
            "seconds_per_measurement": self.seconds,
            "runs": self.runs,
            "concurrency": self.concurrency,
            "warmup_s": self.warmup_s,
            "warm_s": self.warm_s,
        }


async def measure_metric(
    metric: str,
    path: PathUnderTest,
    plan: Plan,
    *,
    seconds: float | None = None,
    cpu_groups: Mapping[str, Sequence[int]] | None = None,
) -> Sample:
    """One measurement; on a path with Redis, with the commands Redis processed meanwhile."""
    before = await path.redis.commands() if path.redis is not None else None
    sample = await measure(
        path.target,
        seconds=plan.seconds if seconds is None else seconds,
        concurrency=1 if metric == LATENCY else plan.concurrency,
        stream=metric == STREAM,
        cpu_groups=cpu_groups,
        warm_s=plan.warm_s,
    )
    if path.redis is not None and before is not None:
        sample = replace(sample, commands=delta(before, await path.redis.commands()))
    return sample


async def run_rounds(
    paths: Sequence[PathUnderTest],
    plan: Plan,
    *,
    cpu_groups: CpuGroups,
    log: Callable[[str], None],
) -> Samples:
    samples: Samples = {path.name: {metric: [] for metric in METRICS} for path in paths}
    for path in paths:  # warm-up: imports, caches, connection pools; not recorded
        for metric in (JSON, STREAM):
            await measure_metric(metric, path, plan, seconds=plan.warmup_s / 2)
    for round_index in range(plan.runs):
        shift = round_index % len(paths)
        order = [*paths[shift:], *paths[:shift]]
        for metric in METRICS:
            for path in order:
                sample = await measure_metric(metric, path, plan, cpu_groups=cpu_groups(path))
                samples[path.name][metric].append(sample)
                brief = _brief(sample, latency=metric == LATENCY)
                log(f"run {round_index + 1}/{plan.runs} {metric:7} {path.name:11} {brief}")
    return samples


def _brief(sample: Sample, *, latency: bool) -> str:
    errors = f" errors={sample.errors} ({sample.first_error})" if sample.errors else ""
    redis = (
        f" redis={sample.commands.get(ROUND_TRIPS, 0) / sample.answered:.3f} trips/req"
        if sample.commands and sample.answered
        else ""
    )
    if latency:
        return (
            f"p50={sample.percentile_ms(50):.2f} ms p99={sample.percentile_ms(99):.2f} ms "
            f"n={sample.ok}{redis}{errors}"
        )
    chunks = f" chunks/s={sample.chunks_per_second:,.0f}" if sample.chunks else ""
    cpu = " ".join(f"{name}={share:.0%}" for name, share in sample.cpu_share.items())
    return f"{sample.per_second:,.0f}/s{chunks} cpu[{cpu}]{redis}{errors}"
