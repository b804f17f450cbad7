"""The Engine dashboard: what each vLLM replica does, from vLLM 0.32's own `vllm:*` series.

Names as vLLM's PrometheusStatLogger (vllm/v1/metrics/loggers.py) registers them, with
prometheus_client's suffixes: counters `_total`, histograms `_bucket`. `$instance` picks the
replicas (vLLM servers scraped); every panel draws one series per replica.
"""

from __future__ import annotations

from typing import Any

from monitoring.grafana.common import (
    COUNT,
    EVENTS_PER_S,
    RATE,
    RATIO,
    REPLICAS,
    REQUESTS_PER_S,
    SECONDS,
    TOKENS_PER_S,
    Board,
    Query,
    label_variable,
    percentile_queries,
    running_and_waiting,
    timeseries_panel,
)

UID = "serving-engine"


def _per_replica_rate(metric: str, legend: str) -> Query:
    return Query(f"sum by (instance) (rate({metric}{{{REPLICAS}}}[{RATE}]))", legend)


def build() -> dict[str, Any]:
    board = Board(
        "Serving / Engine",
        uid=UID,
        description="vLLM replicas: throughput, latency percentiles, scheduler and KV cache.",
    )
    board.variable(
        label_variable(
            "instance",
            "Replica",
            "label_values(vllm:num_requests_running, instance)",
            description="vLLM servers (scrape targets exporting vllm:*)",
        )
    )

    board.row("Throughput")
    board.add(
        timeseries_panel(
            "Tokens per second",
            TOKENS_PER_S,
            [
                _per_replica_rate("vllm:prompt_tokens_total", "prompt {{instance}}"),
                _per_replica_rate("vllm:generation_tokens_total", "generation {{instance}}"),
            ],
            description="Prefill (prompt) and decode (generation) tokens processed per second.",
        )
    )
    board.add(
        timeseries_panel(
            "Finished requests per second",
            REQUESTS_PER_S,
            [
                Query(
                    "sum by (instance, finished_reason) "
                    f"(rate(vllm:request_success_total{{{REPLICAS}}}[{RATE}]))",
                    "{{finished_reason}} {{instance}}",
                )
            ],
            description="Requests vLLM finished, by finish reason (stop, length, abort, ...).",
        )
    )

    board.row("Latency")
    board.add(
        timeseries_panel(
            "Time to first token",
            SECONDS,
            percentile_queries("vllm:time_to_first_token_seconds", REPLICAS),
            description="TTFT percentiles from vllm:time_to_first_token_seconds.",
            width=8,
        )
    )
    board.add(
        timeseries_panel(
            "Inter-token latency",
            SECONDS,
            percentile_queries("vllm:inter_token_latency_seconds", REPLICAS),
            description="ITL percentiles from vllm:inter_token_latency_seconds.",
            width=8,
        )
    )
    board.add(
        timeseries_panel(
            "End-to-end request latency",
            SECONDS,
            percentile_queries("vllm:e2e_request_latency_seconds", REPLICAS),
            description="E2E percentiles from vllm:e2e_request_latency_seconds.",
            width=8,
        )
    )
    board.row("Scheduler")
    board.add(
        timeseries_panel(
            "Running and waiting requests",
            COUNT,
            [
                *running_and_waiting(),
            ],
            description="Requests in the running batch and in the waiting queue.",
        )
    )
    board.add(
        timeseries_panel(
            "Queue time",
            SECONDS,
            percentile_queries("vllm:request_queue_time_seconds", REPLICAS),
            description="Time requests spent waiting before they were scheduled.",
        )
    )
    board.row("KV cache")
    board.add(
        timeseries_panel(
            "KV cache usage",
            RATIO,
            [Query(f"max by (instance) (vllm:kv_cache_usage_perc{{{REPLICAS}}})", "{{instance}}")],
            description="Share of KV cache blocks in use (vllm:kv_cache_usage_perc, 1 = full).",
            max_value=1,
            thresholds=[(0.9, "red")],
            width=8,
        )
    )
    board.add(
        timeseries_panel(
            "Prefix cache hit rate",
            RATIO,
            [
                Query(
                    f"sum by (instance) (rate(vllm:prefix_cache_hits_total{{{REPLICAS}}}[{RATE}]))"
                    "\n/\n"
                    "sum by (instance) "
                    f"(rate(vllm:prefix_cache_queries_total{{{REPLICAS}}}[{RATE}]))",
                    "{{instance}}",
                )
            ],
            description="Prompt tokens found in the prefix cache / prompt tokens looked up.",
            max_value=1,
            width=8,
        )
    )
    board.add(
        timeseries_panel(
            "Preemptions per second",
            EVENTS_PER_S,
            [_per_replica_rate("vllm:num_preemptions_total", "{{instance}}")],
            description="Requests preempted (KV cache full): their KV blocks are recomputed later.",
            width=8,
        )
    )

    return board.to_json()
