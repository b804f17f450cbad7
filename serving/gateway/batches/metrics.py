"""The Batch API's Prometheus series (listed in docs/batches.md, operations), served with the
gateway's (`GatewayMetrics.add_source`) on both ports: none has a tenant label, so an
operator sees the batch load of every key together (a key's own batches: `serving batches
list --key`).

    batch_metrics = BatchMetrics(store)
    batch_metrics.count_line("completed")          # the runner, as a line's result is kept
    batch_metrics.observe(record)                  # a line's RequestRecord: its tokens
    metrics.add_source(batch_metrics.families)

Rules: the gauges are read from the batch database when scraped (they survive a restart and
count every key's batches); the counters are this process's. The batch share of engine work is
`gateway_batch_tokens` against `gateway_tokens` (tokens are what the engines spend their time
on, whatever the scheduling mode; a share of slots would exist only with the fair queue).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal, Protocol

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from serving.gateway.batches.objects import STATUSES
from serving.gateway.metrics import RequestRecord

LineOutcome = Literal["completed", "failed", "expired"]
OUTCOMES: tuple[LineOutcome, ...] = ("completed", "failed", "expired")


class BatchCounts(Protocol):
    """What the gauges read (`BatchStore`)."""

    def status_counts(self) -> dict[str, int]: ...
    def lines_waiting(self) -> int: ...


class BatchMetrics:
    def __init__(self, store: BatchCounts) -> None:
        self._store = store
        # Every outcome from 0, so a rate over a window with no finished line is 0, not absent
        # (the BatchStuck alert reads exactly that).
        self.lines: dict[LineOutcome, int] = dict.fromkeys(OUTCOMES, 0)
        self.tokens = {"prompt": 0, "completion": 0}

    def count_line(self, outcome: LineOutcome) -> None:
        self.lines[outcome] += 1

    def observe(self, record: RequestRecord) -> None:
        """A batch line's request, once it ended: the tokens its key was charged."""
        self.tokens["prompt"] += record.prompt_tokens
        self.tokens["completion"] += record.completion_tokens

    def families(self) -> Iterator[Metric]:
        counts = self._store.status_counts()
        batches = GaugeMetricFamily(
            "gateway_batches", "Batches in the batch database by status, every key's.",
            labels=("status",),
        )  # fmt: skip
        for status in STATUSES:
            batches.add_metric((status,), counts.get(status, 0))
        yield batches
        lines = CounterMetricFamily(
            "gateway_batch_lines",
            "Batch lines finished by this gateway: completed (a 2xx answer), failed (any "
            "other answer, in the error file), expired (not run before the batch expired).",
            labels=("outcome",),
        )
        for outcome, count in self.lines.items():
            lines.add_metric((outcome,), count)
        yield lines
        yield GaugeMetricFamily(
            "gateway_batch_lines_waiting",
            "Lines of the batches in progress without a result yet (the batch queue's depth; "
            "the lines in flight, at most --batch-concurrency a batch, included).",
            value=self._store.lines_waiting(),
        )
        tokens = CounterMetricFamily(
            "gateway_batch_tokens",
            "Tokens charged for batch lines, by kind: their share of gateway_tokens is the "
            "batch share of the engines' work.",
            labels=("kind",),
        )
        for kind, count in self.tokens.items():
            tokens.add_metric((kind,), count)
        yield tokens
