"""The gateway's Prometheus metrics (docs/architecture.md, errors and metrics), one registry
per app; the series are listed in docs/gateway.md (metrics, health and draining), each with
its help text below.

    metrics = GatewayMetrics(leases=store.active_leases)
    record = RequestRecord(started=time.perf_counter())   # filled in while handling
    metrics.observe(record, ended=time.perf_counter())    # once, when the request is done
    body = metrics.render()             # every series: the metrics port (`metrics_listener`)
    body = metrics.render_aggregate()   # no tenant label: GET /metrics on the API port
    metrics.add_source(batch_metrics.families)   # more families without a tenant label

Rules:
- labels carry the key's public id, the model and the engine's host:port, never a secret;
- a series with a tenant label (`TENANT_LABELS`) is served on the metrics port only;
- values are plain numbers updated on the event loop and turned into Prometheus families
  only when scraped (no prometheus_client locks on the request path).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

_K = TypeVar("_K")

NONE = "none"
# Labels that tell one tenant from another: a key's id, and a model, which can be the name of
# a tenant's LoRA adapter. A family with one of them is left out of `render_aggregate`.
TENANT_LABELS = frozenset({"key", "model"})
CONTENT_TYPE = CONTENT_TYPE_LATEST.encode()
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
ADDED_BUCKETS = (0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.002, 0.003, 0.005, 0.01, 0.025, 0.1)


@dataclass(slots=True)
class RequestRecord:
    """What one request did, for `GatewayMetrics.observe` (perf_counter readings)."""

    started: float
    key: str = NONE
    model: str = NONE
    status: int = 0
    refusal: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    upstream_error: str | None = None
    forwarded_at: float = 0.0
    first_byte_at: float = 0.0
    upstream_done_at: float = 0.0
    exchange: Exchange | None = None
    """The exchange with the upstream while it runs: whether the response has started."""

    def note_exchange(self, exchange: Exchange) -> None:
        """The status and timings of the exchange with the upstream (a `ProxyOutcome`)."""
        self.status = exchange.status
        self.forwarded_at = exchange.forwarded_at
        self.first_byte_at = exchange.first_byte_at
        self.upstream_done_at = exchange.upstream_done_at


class Exchange(Protocol):
    @property
    def status(self) -> int: ...
    @property
    def forwarded_at(self) -> float: ...
    @property
    def first_byte_at(self) -> float: ...
    @property
    def upstream_done_at(self) -> float: ...
    @property
    def sse(self) -> bool: ...
    @property
    def open_event(self) -> bool: ...


class Histogram:
    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def buckets(self) -> list[tuple[str, float]]:
        cumulative = 0
        rows: list[tuple[str, float]] = []
        for bound, count in zip(self.bounds, self.counts, strict=False):
            cumulative += count
            rows.append((repr(float(bound)), cumulative))
        rows.append(("+Inf", cumulative + self.counts[-1]))
        return rows


RETIRED = "retired"
"""The engine label the counters of the engines a gateway forgot are summed under."""


class GatewayMetrics:
    def __init__(
        self,
        *,
        leases: Callable[[], int] = lambda: 0,
        budget_flush_failures: Callable[[], int] = lambda: 0,
        usage_write_failures: Callable[[], int] = lambda: 0,
        adapter_sync_errors: Callable[[], int] = lambda: 0,
        quota_store_up: Callable[[], bool] = lambda: True,
        quota_store_errors: Callable[[], int] = lambda: 0,
        keys_file_up: Callable[[], bool] = lambda: True,
        engines: Callable[[], Sequence[EngineState]] = tuple,
        retired: Callable[[], EngineCounts | None] = lambda: None,
        discovery_errors: Callable[[], int] = lambda: 0,
        queue: QueueState | None = None,
        slots_shared: Callable[[], bool | None] = lambda: None,
    ) -> None:
        self.requests: dict[tuple[str, str, str], int] = {}
        self.tokens: dict[tuple[str, str, str], int] = {}
        self.rejections: dict[tuple[str, str], int] = {}
        self.upstream_errors: dict[str, int] = {}
        self.duration: dict[str, Histogram] = {}
        self.ttfb: dict[str, Histogram] = {}
        self.added_latency = Histogram(ADDED_BUCKETS)
        self.in_flight = 0
        self.upstream_healthy = 0.0
        self._leases = leases
        self._budget_flush_failures = budget_flush_failures
        self._usage_write_failures = usage_write_failures
        self._adapter_sync_errors = adapter_sync_errors
        self._quota_store_up = quota_store_up
        self._quota_store_errors = quota_store_errors
        self._keys_file_up = keys_file_up
        self._engines = engines
        self._retired = retired
        self._discovery_errors = discovery_errors
        self._queue = queue
        self._slots_shared = slots_shared
        self._sources: list[Callable[[], Iterable[Metric]]] = []
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)
        self._aggregate = _Aggregate(self)

    def add_source(self, families: Callable[[], Iterable[Metric]]) -> None:
        """More families with no tenant label (a part built after the metrics: the Batch
        API's), served on both ports."""
        self._sources.append(families)

    def set_upstream_healthy(self, healthy: bool) -> None:
        self.upstream_healthy = 1.0 if healthy else 0.0

    def observe(self, record: RequestRecord, ended: float) -> None:
        key, model = record.key, record.model
        labels = (key, model, str(record.status or 499))
        self.requests[labels] = self.requests.get(labels, 0) + 1
        _histogram(self.duration, model).observe(ended - record.started)
        if record.first_byte_at:
            _histogram(self.ttfb, model).observe(record.first_byte_at - record.started)
        if record.prompt_tokens:
            _add(self.tokens, (key, model, "prompt"), record.prompt_tokens)
        if record.completion_tokens:
            _add(self.tokens, (key, model, "completion"), record.completion_tokens)
        if record.refusal is not None:
            _add(self.rejections, (key, record.refusal), 1)
        if record.upstream_error is not None:
            _add(self.upstream_errors, record.upstream_error, 1)
        if record.forwarded_at and record.upstream_done_at:
            own = (record.forwarded_at - record.started) + (ended - record.upstream_done_at)
            self.added_latency.observe(own)

    def render(self) -> bytes:
        """Every series, each key's spend too: for the metrics port alone."""
        return generate_latest(self.registry)

    def render_aggregate(self) -> bytes:
        """The series without a tenant label, for the API port's `/metrics`. The per-key
        families are never built, so its cost does not grow with the keys, though anyone may
        ask for it."""
        return generate_latest(self._aggregate)

    def collect(self) -> Iterator[Metric]:
        """The families, as prometheus_client's registry asks a collector for them."""
        yield from self._tenant_families()
        yield from self.aggregate_families()

    def _tenant_families(self) -> Iterator[Metric]:
        """The families labelled with a key or a model (`TENANT_LABELS`)."""
        requests = CounterMetricFamily(
            "gateway_requests", "Requests by key, model and status.",
            labels=("key", "model", "status"),
        )  # fmt: skip
        for labels, count in self.requests.items():
            requests.add_metric(labels, count)
        yield requests
        yield _histograms(
            "gateway_request_duration_seconds", "Time from gateway entry to the last byte.",
            self.duration,
        )  # fmt: skip
        yield _histograms(
            "gateway_time_to_first_byte_seconds", "Time from gateway entry to the first body byte.",
            self.ttfb,
        )  # fmt: skip
        tokens = CounterMetricFamily(
            "gateway_tokens", "Tokens charged, by kind (prompt or completion).",
            labels=("key", "model", "kind"),
        )  # fmt: skip
        for labels, count in self.tokens.items():
            tokens.add_metric(labels, count)
        yield tokens
        rejections = CounterMetricFamily(
            "gateway_quota_rejections", "Requests refused by a quota limit.",
            labels=("key", "reason"),
        )  # fmt: skip
        for pair, count in self.rejections.items():
            rejections.add_metric(pair, count)
        yield rejections
        if self._queue is not None:
            yield from _queue_key_families(self._queue)

    def aggregate_families(self) -> Iterator[Metric]:
        """The families with no tenant label: what any client of the API port may read."""
        errors = CounterMetricFamily(
            "gateway_upstream_errors", "Upstream failures and malformed responses, by kind.",
            labels=("kind",),
        )  # fmt: skip
        for kind, count in self.upstream_errors.items():
            errors.add_metric((kind,), count)
        yield errors
        yield GaugeMetricFamily(
            "gateway_in_flight_requests", "API requests being handled.", value=self.in_flight
        )
        yield GaugeMetricFamily(
            "gateway_upstream_healthy", "1 while an engine is in the rotation.",
            value=self.upstream_healthy,
        )  # fmt: skip
        yield from self._engine_families()
        if self._queue is not None:
            yield from _queue_families(self._queue)
        shared = self._slots_shared()
        if shared is not None:
            yield GaugeMetricFamily(
                "gateway_queue_shared_up",
                "1 while the replicas share the engines' slots through Redis; 0 while Redis "
                "is away and this replica runs its own part (the slots over --redis-replicas).",
                value=1.0 if shared else 0.0,
            )
        added = HistogramMetricFamily(
            "gateway_added_latency_seconds",
            "The gateway's own time per request: before forwarding plus after the upstream.",
        )
        added.add_metric((), self.added_latency.buckets(), self.added_latency.total)
        yield added
        yield GaugeMetricFamily(
            "gateway_quota_leases", "Quota leases held.", value=float(self._leases())
        )
        yield CounterMetricFamily(
            "gateway_budget_flush_failures",
            "Failed transactions writing day/month budgets (each is rolled back and retried).",
            value=self._budget_flush_failures(),
        )
        yield CounterMetricFamily(
            "gateway_usage_write_failures",
            "Failed writes of the usage ledger (each batch is retried, never added twice).",
            value=self._usage_write_failures(),
        )
        yield CounterMetricFamily(
            "gateway_adapter_sync_errors",
            "Runtime LoRA adapter loads or unloads an engine refused (retried every round).",
            value=self._adapter_sync_errors(),
        )
        yield GaugeMetricFamily(
            "gateway_quota_store_up",
            "1 when the shared quota store answered the last call (1 without one).",
            value=1.0 if self._quota_store_up() else 0.0,
        )
        yield CounterMetricFamily(
            "gateway_quota_store_errors",
            "Calls to the shared quota store that failed or ran out of time.",
            value=self._quota_store_errors(),
        )
        yield GaugeMetricFamily(
            "gateway_keys_file_up",
            "1 while the keys file loads (its keys are refused while it does not).",
            value=1.0 if self._keys_file_up() else 0.0,
        )
        for source in self._sources:
            yield from source()

    def _engine_families(self) -> Iterator[Metric]:
        rotation = GaugeMetricFamily(
            "gateway_engine_in_rotation", "1 while the engine gets requests.", labels=("engine",)
        )
        in_flight = GaugeMetricFamily(
            "gateway_engine_in_flight_requests", "Requests this gateway has on the engine.",
            labels=("engine",),
        )  # fmt: skip
        requests = CounterMetricFamily(
            "gateway_engine_requests", "Requests sent to the engine (failover attempts too).",
            labels=("engine",),
        )  # fmt: skip
        failovers = CounterMetricFamily(
            "gateway_engine_failovers",
            "Requests that failed on the engine before a response and went to another one.",
            labels=("engine",),
        )
        accounted = CounterMetricFamily(
            "gateway_engine_accounted_tokens",
            "Tokens charged to keys for the metered requests the engine served, a prompt once "
            "per sequence run on it (the oracle: vLLM's own prompt and generation counters "
            "must not exceed them).",
            labels=("engine",),
        )
        cut = CounterMetricFamily(
            "gateway_engine_cut_sequences",
            "Sequences (n x prompts) of the metered requests the engine served that ended "
            "without vLLM's final usage (charged by a bound; the oracle allows each a slack).",
            labels=("engine",),
        )
        engines = self._engines()
        for engine in engines:
            label = (engine.label,)
            rotation.add_metric(label, 1.0 if engine.in_rotation else 0.0)
            in_flight.add_metric(label, engine.in_flight)
            requests.add_metric(label, engine.requests)
            failovers.add_metric(label, engine.failovers)
            accounted.add_metric(label, engine.accounted_tokens)
            cut.add_metric(label, engine.cut_sequences)
        retired = self._retired()
        if retired is not None and retired.requests:  # forgotten engines, summed
            label = (RETIRED,)
            requests.add_metric(label, retired.requests)
            failovers.add_metric(label, retired.failovers)
            accounted.add_metric(label, retired.accounted_tokens)
            cut.add_metric(label, retired.cut_sequences)
        yield from (rotation, in_flight, requests, failovers, accounted, cut)
        yield GaugeMetricFamily(
            "gateway_engines_known",
            "Engines this gateway routes to (listed or discovered; draining ones left out).",
            value=sum(1 for engine in engines if not engine.draining),
        )
        yield GaugeMetricFamily(
            "gateway_engines_healthy",
            "Engines in the rotation: their last health probe passed.",
            value=sum(1 for engine in engines if engine.in_rotation),
        )
        yield CounterMetricFamily(
            "gateway_engine_discovery_errors",
            "Engine lookups the DNS server did not answer (the last answer was kept).",
            value=self._discovery_errors(),
        )


class EngineCounts(Protocol):
    """An engine's counters (`routing.Engine`; forgotten ones summed: `routing.Retired`)."""

    @property
    def requests(self) -> int: ...
    @property
    def failovers(self) -> int: ...
    @property
    def accounted_tokens(self) -> int: ...
    @property
    def cut_sequences(self) -> int: ...


class EngineState(EngineCounts, Protocol):
    """What the metrics read of an engine (`routing.Engine`)."""

    @property
    def label(self) -> str: ...
    @property
    def in_rotation(self) -> bool: ...
    @property
    def draining(self) -> bool: ...
    @property
    def in_flight(self) -> int: ...


class KeyQueueState(Protocol):
    @property
    def waited(self) -> Histogram: ...
    @property
    def timeouts(self) -> int: ...
    @property
    def left(self) -> int: ...


class QueueState(Protocol):
    """What the metrics read of the fair queue (`fair_queue.FairQueue`)."""

    @property
    def slots(self) -> int: ...
    @property
    def engine_slots(self) -> int: ...
    @property
    def running(self) -> int: ...
    @property
    def stats(self) -> Mapping[str, KeyQueueState]: ...
    def waiting(self, key: str | None = None) -> int: ...


class _Aggregate:
    """The aggregate families as a collector of their own, for `generate_latest`."""

    __slots__ = ("_metrics",)

    def __init__(self, metrics: GatewayMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        return self._metrics.aggregate_families()


def _queue_families(queue: QueueState) -> Iterator[Metric]:
    yield GaugeMetricFamily(
        "gateway_queue_slots",
        "Sequences this gateway lets run at once (fair sharing): the engines' slots, or its "
        "part of them when replicas share them through Redis.",
        value=queue.slots,
    )
    yield GaugeMetricFamily(
        "gateway_queue_engine_slots", "Sequences the engines in rotation run well at once.",
        value=queue.engine_slots,
    )  # fmt: skip
    yield GaugeMetricFamily(
        "gateway_queue_running", "Requests holding a slot now.", value=queue.running
    )


def _queue_key_families(queue: QueueState) -> Iterator[Metric]:
    waiting = GaugeMetricFamily(
        "gateway_queue_waiting", "Requests waiting for a slot, by key.", labels=("key",)
    )
    waited = HistogramMetricFamily(
        "gateway_queue_wait_seconds",
        "Time from admission to a slot, by key (0 for a request that found one free).",
        labels=("key",),
    )
    timeouts = CounterMetricFamily(
        "gateway_queue_timeouts", "Requests that waited their deadline (503, nothing charged).",
        labels=("key",),
    )  # fmt: skip
    left = CounterMetricFamily(
        "gateway_queue_abandoned", "Requests whose client went away while they waited.",
        labels=("key",),
    )  # fmt: skip
    for key, stats in queue.stats.items():
        waiting.add_metric((key,), queue.waiting(key))
        waited.add_metric((key,), stats.waited.buckets(), stats.waited.total)
        timeouts.add_metric((key,), stats.timeouts)
        left.add_metric((key,), stats.left)
    yield from (waiting, waited, timeouts, left)


def _add(counts: dict[_K, int], key: _K, amount: int) -> None:
    counts[key] = counts.get(key, 0) + amount


def _histogram(histograms: dict[str, Histogram], model: str) -> Histogram:
    histogram = histograms.get(model)
    if histogram is None:
        histogram = histograms[model] = Histogram(DURATION_BUCKETS)
    return histogram


def _histograms(name: str, documentation: str, by_model: dict[str, Histogram]) -> Metric:
    family = HistogramMetricFamily(name, documentation, labels=("model",))
    for model, histogram in by_model.items():
        family.add_metric((model,), histogram.buckets(), histogram.total)
    return family
