"""The scraped series the Prometheus rules read: job names and every metric name, by job.

    for series in SCRAPED: series.name, series.family, series.type, series.job
    JOBS                   # the scrape jobs prometheus.yml must define, rules select on
    PROMETHEUS_MADE        # series Prometheus makes itself (`up`), not in any /metrics
    CLUSTER_MADE           # series a Kubernetes cluster exports (kube-state-metrics), read
                           # where the stack runs from k8s/; no local scrape has them

`name` is the name as a scrape shows it and as the rules spell it: counters end in `_total`,
histograms are read through `_bucket`. `family` is the name its exporter declares:

    gateway          serving/gateway/metrics.py (GatewayMetrics; the module docstring lists all)
    vllm             vLLM 0.32's vllm/v1/metrics/loggers.py (PrometheusStatLogger)
    engine-launcher  serving/engine/launcher_metrics.py (LauncherMetrics)

tests/monitoring/test_rules.py holds this list against the rule files (every name used is
listed, every listed name is used), tests/monitoring/test_series.py against those exporters
(monitoring/exported.py: the gateway's and the launcher's rendered /metrics, vLLM's source);
a live test can check each `name` in a real scrape (`up` comes from Prometheus itself).

vLLM renamed or dropped several metrics that older dashboards still chart; none exists in
0.32 and none may appear under monitoring/ (REMOVED_VLLM, checked by both tests).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

GATEWAY = "gateway"
ENGINE = "vllm"
LAUNCHER = "engine-launcher"
JOBS = (GATEWAY, ENGINE, LAUNCHER)

MetricType = Literal["counter", "gauge", "histogram"]
SUFFIX: dict[MetricType, str] = {"counter": "_total", "gauge": "", "histogram": "_bucket"}


@dataclass(frozen=True)
class Scraped:
    family: str
    type: MetricType
    job: str

    @property
    def name(self) -> str:
        """The name in a scrape, as the rules read it."""
        return self.family + SUFFIX[self.type]


SCRAPED: tuple[Scraped, ...] = (
    # the gateway
    Scraped("gateway_requests", "counter", GATEWAY),
    Scraped("gateway_tokens", "counter", GATEWAY),
    Scraped("gateway_quota_rejections", "counter", GATEWAY),
    Scraped("gateway_added_latency_seconds", "histogram", GATEWAY),
    Scraped("gateway_upstream_healthy", "gauge", GATEWAY),
    Scraped("gateway_engine_in_rotation", "gauge", GATEWAY),
    Scraped("gateway_budget_flush_failures", "counter", GATEWAY),
    Scraped("gateway_usage_write_failures", "counter", GATEWAY),
    Scraped("gateway_queue_timeouts", "counter", GATEWAY),
    # (label: key) requests waiting for a slot: who is backlogged, for the fairness index
    Scraped("gateway_queue_waiting", "gauge", GATEWAY),
    # per engine (label: its host:port), what the gateway charged: the live accounting oracle
    Scraped("gateway_engine_accounted_tokens", "counter", GATEWAY),
    Scraped("gateway_engine_cut_sequences", "counter", GATEWAY),
    # the Batch API (labels: outcome): lines finished, and lines of running batches waiting
    Scraped("gateway_batch_lines", "counter", GATEWAY),
    Scraped("gateway_batch_lines_waiting", "gauge", GATEWAY),
    # vLLM (labels: model_name, engine)
    Scraped("vllm:prompt_tokens", "counter", ENGINE),
    Scraped("vllm:generation_tokens", "counter", ENGINE),
    # (and `source`: local_compute | local_cache_hit | external_kv_transfer)
    Scraped("vllm:prompt_tokens_by_source", "counter", ENGINE),
    Scraped("vllm:time_to_first_token_seconds", "histogram", ENGINE),
    Scraped("vllm:inter_token_latency_seconds", "histogram", ENGINE),
    Scraped("vllm:e2e_request_latency_seconds", "histogram", ENGINE),
    Scraped("vllm:kv_cache_usage_perc", "gauge", ENGINE),
    Scraped("vllm:num_requests_running", "gauge", ENGINE),
    Scraped("vllm:num_requests_waiting", "gauge", ENGINE),
    Scraped("vllm:num_preemptions", "counter", ENGINE),
    Scraped("vllm:prefix_cache_hits", "counter", ENGINE),
    Scraped("vllm:prefix_cache_queries", "counter", ENGINE),
    # the engine launcher (labels: profile, model = the served model name)
    Scraped("serving_engine_startup_seconds", "gauge", LAUNCHER),
    Scraped("serving_engine_restarts", "counter", LAUNCHER),
)

PROMETHEUS_MADE = ("up",)
# In Kubernetes the kubelet, not the launcher, restarts vLLM: EngineRestarting reads its count.
CLUSTER_MADE = ("kube_pod_container_status_restarts_total",)

# Gone from vLLM by 0.32 (V0-engine names): KV usage is vllm:kv_cache_usage_perc, the prefix
# cache hit rate is vllm:prefix_cache_hits / vllm:prefix_cache_queries, TPOT is
# vllm:inter_token_latency_seconds (per token) or vllm:request_time_per_output_token_seconds.
REMOVED_VLLM = (
    "vllm:gpu_cache_usage_perc",
    "vllm:cpu_cache_usage_perc",
    "vllm:gpu_prefix_cache_hit_rate",
    "vllm:cpu_prefix_cache_hit_rate",
    "vllm:gpu_prefix_cache_queries",
    "vllm:gpu_prefix_cache_hits",
    "vllm:num_requests_swapped",
    "vllm:time_per_output_token_seconds",
    "vllm:avg_prompt_throughput_toks_per_s",
    "vllm:avg_generation_throughput_toks_per_s",
)


def scraped_names() -> set[str]:
    """Every series name the rules read from a scrape (Prometheus' own `up` not included)."""
    return {series.name for series in SCRAPED}
