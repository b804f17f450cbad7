"""Medians, ratios, the targets (docs/architecture.md, performance targets), and the table:
printed and written.

summary = summarise(samples)                 # per path: medians over the runs
results = local_results(paths, samples, ...) # the JSON document
write_results(results, out_dir, "gateway_overhead", markdown(results))  # gateway_overhead/<date>.*
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from bench.gateway_overhead.load import LOADGEN, MACHINE, Sample
from bench.gateway_overhead.paths import GATEWAY_REDIS, REDIS_PROCESS
from bench.gateway_overhead.redis_server import ROUND_TRIPS, TOTAL
from bench.gateway_overhead.runner import JSON, LATENCY, STREAM
from bench.results_files import run_stem

Json = dict[str, object]

# docs/architecture.md, performance targets.
MAX_ADDED_P50_MS = 1.0
MAX_ADDED_P99_MS = 3.0
MIN_SHARE_OF_PASSTHROUGH = 0.85
MIN_TIMES_LITELLM = 20.0
MIN_SHARE_OF_DIRECT_REAL = 0.98
# The scale-out issue: the Redis store keeps >= 70% of the in-process store's requests/s, and
# costs at most one round trip per request: the reservation (one EVALSHA), which also carries
# the settles of the requests that ended before it (the store queues them), plus upkeep
# shared by all requests (PING, lease renewals and reclaims every few seconds, a settle sent
# by itself when no reservation came within the settle delay) that this allows for.
MIN_SHARE_OF_IN_PROCESS = 0.70
MAX_REDIS_ROUND_TRIPS_PER_REQUEST = 1.05


def _median(values: Sequence[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return statistics.median(finite) if finite else float("nan")


def summarise(per_metric: Mapping[str, Sequence[Sample]]) -> dict[str, float]:
    """Medians over the runs of one path."""
    latency, json_load, streams = per_metric[LATENCY], per_metric[JSON], per_metric[STREAM]

    def cpu(samples: Sequence[Sample], name: str) -> float:
        return _median([s.cpu_share.get(name, float("nan")) for s in samples])

    def cost_us(samples: Sequence[Sample], name: str = "proxy") -> float:
        """CPU of `name` per completed request: robust to other load stealing its core."""
        return _median(
            [s.cpu_share.get(name, math.nan) / s.per_second * 1e6 for s in samples if s.ok]
        )

    all_samples = [*latency, *json_load, *streams]
    redis: dict[str, float] = {}
    if any(s.commands for s in all_samples):
        redis = {
            "redis_round_trips_per_req": _per_request(json_load, ROUND_TRIPS),
            "redis_evalsha_per_req": _per_request(json_load, "evalsha"),
            "redis_round_trips_per_stream": _per_request(streams, ROUND_TRIPS),
            "redis_evalsha_per_stream": _per_request(streams, "evalsha"),
            "redis_round_trips_per_req_one_at_a_time": _per_request(latency, ROUND_TRIPS),
            "redis_commands_per_req": _per_request(json_load, TOTAL),
            "redis_cpu_json": cpu(json_load, REDIS_PROCESS),
            "redis_cpu_us_per_req": cost_us(json_load, REDIS_PROCESS),
            "redis_cpu_us_per_stream": cost_us(streams, REDIS_PROCESS),
        }
    return {
        "p50_ms": _median([s.percentile_ms(50) for s in latency]),
        "p99_ms": _median([s.percentile_ms(99) for s in latency]),
        "req_per_s": _median([s.per_second for s in json_load]),
        "streams_per_s": _median([s.per_second for s in streams]),
        "chunks_per_s": _median([s.chunks_per_second for s in streams]),
        "proxy_cpu_json": cpu(json_load, "proxy"),
        "proxy_cpu_stream": cpu(streams, "proxy"),
        "proxy_cpu_us_per_req": cost_us(json_load),
        "proxy_cpu_us_per_stream": cost_us(streams),
        "upstream_cpu_json": cpu(json_load, "upstream"),
        "loadgen_cpu_json": cpu(json_load, LOADGEN),
        "machine_cpu_json": cpu(json_load, MACHINE),
        "requests_ok": sum(s.ok for s in all_samples),
        "errors": sum(s.errors for s in all_samples),
        **redis,
    }


def _per_request(samples: Sequence[Sample], command: str) -> float:
    """Median over the runs of `command`'s calls (or `total`, `round_trips`) per request
    answered."""
    return _median([s.commands.get(command, 0) / s.answered for s in samples if s.answered])


def commands_by_name(per_metric: Mapping[str, Sequence[Sample]]) -> dict[str, int]:
    """Every command Redis processed in the recorded measurements, by name, and the requests
    answered meanwhile (`requests`): what the commands per request are made of."""
    totals: dict[str, int] = {}
    answered = 0
    for samples in per_metric.values():
        for sample in samples:
            answered += sample.answered
            for name, calls in sample.commands.items():
                totals[name] = totals.get(name, 0) + calls
    return {"requests": answered, **dict(sorted(totals.items(), key=lambda kv: -kv[1]))}


def sample_record(sample: Sample) -> Json:
    record: Json = {
        "seconds": round(sample.seconds, 3),
        "ok": sample.ok,
        "errors": sample.errors,
        "per_s": round(sample.per_second, 1),
        "cpu_share": {k: round(v, 3) for k, v in sample.cpu_share.items()},
    }
    if sample.latencies_ms:
        record["p50_ms"] = round(sample.percentile_ms(50), 3)
        record["p99_ms"] = round(sample.percentile_ms(99), 3)
    if sample.chunks:
        record["chunks_per_s"] = round(sample.chunks_per_second, 1)
    if sample.first_error:
        record["first_error"] = sample.first_error
    if sample.commands:
        record["answered"] = sample.answered
        record["redis_commands"] = dict(sample.commands)
    return record


def ratios(summaries: Mapping[str, Mapping[str, float]]) -> dict[str, dict[str, float]]:
    """Per path: latency added to direct, throughput as a share of the passthrough, and our
    gateway's throughput as a multiple of LiteLLM's."""
    out: dict[str, dict[str, float]] = {}
    direct = summaries.get("direct")
    base = summaries.get("passthrough")
    for name, s in summaries.items():
        r: dict[str, float] = {}
        if direct is not None and name != "direct":
            r["added_p50_ms"] = s["p50_ms"] - direct["p50_ms"]
            r["added_p99_ms"] = s["p99_ms"] - direct["p99_ms"]
        if base is not None:
            r["req_share_of_passthrough"] = _div(s["req_per_s"], base["req_per_s"])
            r["streams_share_of_passthrough"] = _div(s["streams_per_s"], base["streams_per_s"])
            if name != "direct":
                # The same shares per proxy CPU second: what one dedicated core sustains.
                r["req_per_cpu_share_of_passthrough"] = _div(
                    base["proxy_cpu_us_per_req"], s["proxy_cpu_us_per_req"]
                )
                r["streams_per_cpu_share_of_passthrough"] = _div(
                    base["proxy_cpu_us_per_stream"], s["proxy_cpu_us_per_stream"]
                )
        out[name] = r
    gateway, litellm = summaries.get("gateway"), summaries.get("litellm")
    redis = summaries.get(GATEWAY_REDIS)
    if gateway is not None and redis is not None:
        # Same gateway, same rounds: what moving its quotas to Redis costs.
        out[GATEWAY_REDIS] |= {
            "req_share_of_in_process": _div(redis["req_per_s"], gateway["req_per_s"]),
            "streams_share_of_in_process": _div(redis["streams_per_s"], gateway["streams_per_s"]),
            "added_p50_ms_vs_in_process": redis["p50_ms"] - gateway["p50_ms"],
            "added_p99_ms_vs_in_process": redis["p99_ms"] - gateway["p99_ms"],
            "proxy_cpu_us_per_req_vs_in_process": (
                redis["proxy_cpu_us_per_req"] - gateway["proxy_cpu_us_per_req"]
            ),
        }
    if gateway is not None and litellm is not None:
        out["gateway"]["req_times_litellm"] = _div(gateway["req_per_s"], litellm["req_per_s"])
        out["gateway"]["streams_times_litellm"] = _div(
            gateway["streams_per_s"], litellm["streams_per_s"]
        )
    return out


def _div(a: float, b: float) -> float:
    return a / b if b > 0 and not math.isnan(a) else float("nan")


def _check(name: str, measured: float | None, ok: Callable[[float], bool], unit: str) -> Json:
    if measured is None or math.isnan(measured):
        return {"target": name, "measured": None, "verdict": "not measured"}
    return {
        "target": name,
        "measured": round(measured, 3),
        "unit": unit,
        "verdict": "pass" if ok(measured) else "MISS",
    }


def local_targets(r: Mapping[str, Mapping[str, float]]) -> list[Json]:
    g = r.get("gateway", {})
    return [
        _check(
            f"gateway adds <= {MAX_ADDED_P50_MS:g} ms p50 (one at a time, JSON)",
            g.get("added_p50_ms"),
            lambda v: v <= MAX_ADDED_P50_MS,
            "ms",
        ),
        _check(
            f"gateway adds <= {MAX_ADDED_P99_MS:g} ms p99 (one at a time, JSON)",
            g.get("added_p99_ms"),
            lambda v: v <= MAX_ADDED_P99_MS,
            "ms",
        ),
        _check(
            f"gateway req/s >= {MIN_SHARE_OF_PASSTHROUGH:.0%} of the minimal passthrough",
            g.get("req_share_of_passthrough"),
            lambda v: v >= MIN_SHARE_OF_PASSTHROUGH,
            "share",
        ),
        _check(
            f"gateway streams/s >= {MIN_SHARE_OF_PASSTHROUGH:.0%} of the minimal passthrough",
            g.get("streams_share_of_passthrough"),
            lambda v: v >= MIN_SHARE_OF_PASSTHROUGH,
            "share",
        ),
        _check(
            f"same, per proxy CPU second: req/s >= {MIN_SHARE_OF_PASSTHROUGH:.0%} of passthrough",
            g.get("req_per_cpu_share_of_passthrough"),
            lambda v: v >= MIN_SHARE_OF_PASSTHROUGH,
            "share",
        ),
        _check(
            f"same, per proxy CPU second: streams/s >= {MIN_SHARE_OF_PASSTHROUGH:.0%} of "
            "passthrough",
            g.get("streams_per_cpu_share_of_passthrough"),
            lambda v: v >= MIN_SHARE_OF_PASSTHROUGH,
            "share",
        ),
        _check(
            f"gateway req/s >= {MIN_TIMES_LITELLM:g}x LiteLLM's",
            g.get("req_times_litellm"),
            lambda v: v >= MIN_TIMES_LITELLM,
            "times",
        ),
    ]


def redis_targets(
    r: Mapping[str, Mapping[str, float]], round_trips_per_req: float | None
) -> list[Json]:
    g = r.get(GATEWAY_REDIS, {})
    return [
        _check(
            f"Redis store: req/s >= {MIN_SHARE_OF_IN_PROCESS:.0%} of the in-process store's",
            g.get("req_share_of_in_process"),
            lambda v: v >= MIN_SHARE_OF_IN_PROCESS,
            "share",
        ),
        _check(
            f"Redis store: streams/s >= {MIN_SHARE_OF_IN_PROCESS:.0%} of the in-process store's",
            g.get("streams_share_of_in_process"),
            lambda v: v >= MIN_SHARE_OF_IN_PROCESS,
            "share",
        ),
        _check(
            "Redis store: at most one round trip per request (the reservation, carrying "
            f"earlier settles): <= {MAX_REDIS_ROUND_TRIPS_PER_REQUEST:g} per request, upkeep "
            "included",
            round_trips_per_req,
            lambda v: v <= MAX_REDIS_ROUND_TRIPS_PER_REQUEST,
            "count",
        ),
    ]


def real_target(share: float, what: str) -> Json:
    return _check(
        f"{what} through the gateway >= {MIN_SHARE_OF_DIRECT_REAL:.0%} of direct vLLM's",
        share,
        lambda v: v >= MIN_SHARE_OF_DIRECT_REAL,
        "share",
    )


def missed(targets: Sequence[Mapping[str, object]]) -> bool:
    return any(t["verdict"] == "MISS" for t in targets)


def write_results(results: Json, out_dir: Path, stem: str, text: str) -> tuple[Path, Path]:
    """Write this run's `<date>.json` and `<date>.md` into `out_dir`/`stem`/, each atomically
    (write, then rename); the date is the day of `results["created"]`, and a later run the
    same day takes `<date>-2` and so on (bench.results_files), so no earlier run is replaced."""
    directory = out_dir / stem
    directory.mkdir(parents=True, exist_ok=True)
    run = run_stem(directory, str(results["created"]))
    paths = (directory / f"{run}.json", directory / f"{run}.md")
    contents = (json.dumps(results, indent=2, allow_nan=False) + "\n", text)
    for path, content in zip(paths, contents, strict=True):
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(content)
        tmp.replace(path)
    return paths


def clean(value: object) -> object:
    """`value` with NaN floats replaced by None (JSON has no NaN) and floats rounded."""
    if isinstance(value, float):
        return None if math.isnan(value) else round(value, 4)
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    return value
