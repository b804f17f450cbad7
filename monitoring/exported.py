"""The series this stack exports, known without running it: the names a scrape would show.

    exported_names()      # all of the below: what any query under monitoring/ may read
    gateway_names()       # GatewayMetrics rendered after a request of every kind, with
                          # the Batch API's series
    launcher_names()      # LauncherMetrics rendered after a start
    vllm_declarations()   # vLLM 0.32's stat logger, read from its installed source:
                          # {"vllm:num_preemptions": "counter", ...} (no vLLM import)
    vllm_names()          # those with their exposition suffixes (_total, _bucket/_sum/_count)

Names are as scraped: counters end in `_total`, histograms have `_bucket`, `_sum`, `_count`.
A live scrape of the stack is the final word (the integration test); this is the offline
check that fails first, for example when a vLLM upgrade renames a metric.
"""

from __future__ import annotations

import asyncio
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from serving.engine.launcher_metrics import LauncherMetrics
from serving.engine.load_stats import LoadStats
from serving.gateway.batches.metrics import BatchMetrics
from serving.gateway.fair_queue import FairQueue
from serving.gateway.metrics import GatewayMetrics, RequestRecord
from serving.models.tiny_model import MODEL_NAME

SUFFIXES = {"gauge": ("",), "counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
_DECLARATION = re.compile(r'self\._(gauge|counter|histogram)_cls\(\s*name="(vllm:[a-z0-9_]+)"')
# Info-style gauges vLLM registers under a name held in a variable (log_metrics_info).
_VLLM_INFO = {"vllm:cache_config_info": "gauge"}


def sample_names(exposition: str) -> set[str]:
    return {
        sample.name
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
    }


class _Batches:
    """A batch database as the batch metrics read it (`BatchStore`): one batch running."""

    def status_counts(self) -> dict[str, int]:
        return {"in_progress": 1}

    def lines_waiting(self) -> int:
        return 2


@dataclass(frozen=True)
class _Engine:
    """An engine as the gateway's metrics read it (`serving.gateway.routing.Engine`)."""

    label: str = "10.0.0.1:8000"
    in_rotation: bool = True
    draining: bool = False
    in_flight: int = 0
    requests: int = 1
    failovers: int = 0
    accounted_tokens: int = 0
    cut_sequences: int = 0


def gateway_names() -> set[str]:
    queue = FairQueue(16, reserved=2, timeout_s=30.0)
    queue.release(asyncio.run(queue.turn("key_a", cost=16)))  # a key with queue series
    metrics = GatewayMetrics(engines=lambda: [_Engine()], discovery_errors=lambda: 0, queue=queue)
    served = RequestRecord(
        started=1.0, key="key_a", model=MODEL_NAME, status=200, prompt_tokens=12,
        completion_tokens=4, upstream_error="in_band", forwarded_at=1.001, first_byte_at=1.2,
        upstream_done_at=1.5,
    )  # fmt: skip
    metrics.observe(served, ended=1.501)
    metrics.observe(RequestRecord(started=2.0, key="key_a", status=429, refusal="rpm"), ended=2.1)
    metrics.add_source(BatchMetrics(_Batches()).families)
    return sample_names(metrics.render().decode())


def launcher_names() -> set[str]:
    metrics = LauncherMetrics("cpu-tiny", MODEL_NAME)
    metrics.record_start(LoadStats(40.0, 37.0, 0.02, 1 << 30), restart=True)
    return sample_names(generate_latest(metrics.registry).decode())


def vllm_loggers_source() -> Path:
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("vLLM is not installed (the `cpu` or `gpu` extra)")
    return Path(next(iter(spec.submodule_search_locations))) / "v1" / "metrics" / "loggers.py"


def vllm_declarations() -> dict[str, str]:
    """vLLM's Prometheus metric families and their types, as its stat logger declares them."""
    path = vllm_loggers_source()
    source = path.read_text(encoding="utf-8")
    declared = {name: kind for kind, name in _DECLARATION.findall(source)}
    if len(declared) < 20 or any(f'"{name}"' not in source for name in _VLLM_INFO):
        raise RuntimeError(f"{path}: vLLM's metric declarations no longer look as expected")
    return declared | _VLLM_INFO


def vllm_names() -> set[str]:
    return {
        name + suffix for name, kind in vllm_declarations().items() for suffix in SUFFIXES[kind]
    }


def exported_names() -> set[str]:
    return gateway_names() | launcher_names() | vllm_names()
