"""The batch series: batches by status and lines waiting read from the database, lines
counted by outcome as the runner keeps them, tokens of batch lines; on both of a gateway's
ports, with no key in any label."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from serving.gateway.batches.line_call import LineResult
from serving.gateway.batches.metrics import BatchMetrics, LineOutcome
from serving.gateway.batches.objects import STATUSES, WINDOW_S, BatchRow
from serving.gateway.batches.store import BatchStore
from serving.gateway.keys import SqliteKeyStore
from serving.gateway.keys.record import KeySpec
from serving.gateway.metrics import GatewayMetrics, RequestRecord
from tests.gateway.conftest import GatewayFactory
from tests.gateway.scrape import scrape, value
from tests.gateway.servers import http_client

from .helpers import jsonl, line, make_setup, run_batch
from .test_runner import new_batch, settle

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def samples_of(metrics: BatchMetrics) -> Samples:
    gateway = GatewayMetrics()
    gateway.add_source(metrics.families)
    text = generate_latest(gateway.registry).decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def batch(store: BatchStore, batch_id: str, status: str, total: int) -> None:
    row = BatchRow(batch_id, "k1", "/v1/completions", "file-a", 1, 2)
    store.add_batch(row)
    row.status, row.total = status, total  # type: ignore[assignment]
    assert store.save_batch(row, "validating")


def test_the_gauges_read_every_keys_batches_from_the_database(tmp_path: Path) -> None:
    store = BatchStore(tmp_path / "b.db")
    metrics = BatchMetrics(store)
    empty = samples_of(metrics)
    assert all(value(empty, "gateway_batches", status=status) == 0 for status in STATUSES)
    assert ("gateway_batches", frozenset({("status", "in_progress")})) in empty
    assert value(empty, "gateway_batch_lines_waiting") == 0
    batch(store, "batch_a", "in_progress", 5)
    batch(store, "batch_b", "in_progress", 3)
    batch(store, "batch_c", "completed", 7)  # ended: none of its lines wait
    batch(store, "batch_d", "validating", 0)
    store.add_result("batch_a", 1, "one", ok=True, text="{}")
    store.add_result("batch_a", 2, "two", ok=False, text="{}")
    store.add_result("batch_c", 1, "one", ok=True, text="{}")
    seen = samples_of(metrics)
    assert value(seen, "gateway_batches", status="in_progress") == 2
    assert value(seen, "gateway_batches", status="completed") == 1
    assert value(seen, "gateway_batches", status="validating") == 1
    assert value(seen, "gateway_batches", status="failed") == 0
    assert value(seen, "gateway_batch_lines_waiting") == 5 - 2 + 3


def test_the_runner_counts_each_line_by_outcome(tmp_path: Path) -> None:
    setup = make_setup(tmp_path)
    setup.engine.answers["b"] = [LineResult(400, b"{}", "r")]
    setup.engine.answers["d"] = [LineResult(429, b"{}", "r", retry_after_s=3600)]
    counted: list[LineOutcome] = []

    async def scenario() -> None:
        runner = setup.runner(count_line=counted.append)
        done = new_batch(setup, jsonl(line("a"), line("b")))
        await settle(runner, setup, done.id, "completed")
        assert sorted(counted) == ["completed", "failed"]
        expiring = new_batch(setup, jsonl(line("c"), line("d")))
        await settle(runner, setup, expiring.id, "in_progress")
        for _ in range(50):  # c runs; d waits an hour to retry
            await runner.run_once()
            await asyncio.sleep(0.002)
        setup.clock.now += WINDOW_S
        await settle(runner, setup, expiring.id, "expired")

    asyncio.run(scenario())
    assert sorted(counted) == ["completed", "completed", "expired", "failed"]


def test_lines_and_tokens_are_counters_from_zero(tmp_path: Path) -> None:
    metrics = BatchMetrics(BatchStore(tmp_path / "b.db"))
    fresh = samples_of(metrics)
    for outcome in ("completed", "failed", "expired"):  # a rate of 0, not an absent series
        assert ("gateway_batch_lines_total", frozenset({("outcome", outcome)})) in fresh
    metrics.count_line("completed")
    metrics.count_line("completed")
    metrics.observe(RequestRecord(1.0, key="k1", prompt_tokens=7, completion_tokens=3))
    metrics.observe(RequestRecord(1.0, key="k1", prompt_tokens=2))
    seen = samples_of(metrics)
    assert value(seen, "gateway_batch_lines_total", outcome="completed") == 2
    assert value(seen, "gateway_batch_tokens_total", kind="prompt") == 9
    assert value(seen, "gateway_batch_tokens_total", kind="completion") == 3


def test_a_gateways_batch_series_count_what_its_lines_were_charged(
    make_gateway: GatewayFactory, keys: SqliteKeyStore
) -> None:
    gateway = make_gateway(keys_db=str(keys.path))
    record, secret = keys.create(KeySpec("offline"))
    assert run_batch(gateway, secret, uuid.uuid4().hex)["request_counts"]["completed"] == 2
    samples = scrape(gateway)
    assert value(samples, "gateway_batches", status="completed") == 1
    assert value(samples, "gateway_batch_lines_total", outcome="completed") == 2
    assert value(samples, "gateway_batch_lines_waiting") == 0
    for kind in ("prompt", "completion"):
        charged = value(samples, "gateway_tokens_total", key=record.key_id, model="fake", kind=kind)
        assert charged > 0
        assert value(samples, "gateway_batch_tokens_total", kind=kind) == charged
    with http_client(gateway.url, key=None) as http:
        aggregate = http.get("/metrics").text  # the API port: no tenant label, batch series too
    assert 'gateway_batch_lines_total{outcome="completed"} 2.0' in aggregate
    assert record.key_id not in aggregate
