"""/metrics: the gateway_* series (docs/architecture.md, errors and metrics), one registry
per app."""

from __future__ import annotations

import threading

import pytest

from serving.gateway.metrics import GatewayMetrics, RequestRecord
from tests.gateway.conftest import GatewayFactory, eventually
from tests.gateway.fake_upstream import FakeUpstream
from tests.gateway.scrape import scrape, settled, value
from tests.gateway.servers import TEST_KEY, closed_port, http_client

pytestmark = pytest.mark.timeout(30)

CHAT = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
SERIES = (
    "gateway_requests_total",
    "gateway_request_duration_seconds_bucket",
    "gateway_time_to_first_byte_seconds_bucket",
    "gateway_tokens_total",
    "gateway_in_flight_requests",
    "gateway_upstream_healthy",
    "gateway_added_latency_seconds_bucket",
    "gateway_quota_leases",
    "gateway_quota_store_up",
    "gateway_quota_store_errors_total",
    "gateway_keys_file_up",
    "gateway_usage_write_failures_total",
    "gateway_adapter_sync_errors_total",
)


def test_metrics_need_no_key_and_cover_the_design(
    make_gateway: GatewayFactory, upstream: FakeUpstream, token: str
) -> None:
    gateway = make_gateway()
    with http_client(gateway.url) as http:
        assert http.post("/v1/chat/completions", json=CHAT).status_code == 200
        assert http.post("/v1/chat/completions", json={**CHAT, "stream": True}).status_code == 200
        assert http.post("/v1/chat/completions", json={**CHAT, "model": "nope"}).status_code == 200
        holder = threading.Thread(
            target=http.post,
            args=(f"/v1/chat/completions?t={token}",),
            kwargs={"json": {**CHAT, "model": "gated"}},
        )
        holder.start()
        assert upstream.wait_for(f"{token}:started", 5)
        during = scrape(gateway)
        upstream.release(token)
        holder.join(5)
    with http_client(gateway.url, key=None) as http:
        response = http.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    assert value(during, "gateway_in_flight_requests") == 1
    assert value(during, "gateway_quota_leases") == 1
    assert settled(gateway)
    samples = scrape(gateway)
    names = {name for name, _ in samples}
    assert set(SERIES) <= names
    assert value(samples, "gateway_requests_total", key="dev", model="fake", status="200") == 2
    # A model the upstream does not list is labelled "other": clients cannot mint labels.
    assert value(samples, "gateway_requests_total", key="dev", model="other", status="200") == 2
    assert value(samples, "gateway_tokens_total", key="dev", model="fake", kind="completion") == 6
    assert value(samples, "gateway_upstream_healthy") == 1
    assert value(samples, "gateway_added_latency_seconds_count") == 4
    assert value(samples, "gateway_time_to_first_byte_seconds_count", model="fake") == 2
    assert TEST_KEY not in response.text


def test_upstream_health_and_error_series(make_gateway: GatewayFactory) -> None:
    gateway = make_gateway(upstream=f"http://127.0.0.1:{closed_port()}")
    with http_client(gateway.url) as http:
        assert http.post("/v1/chat/completions", json=CHAT).status_code == 503
    samples = scrape(gateway)
    assert value(samples, "gateway_upstream_healthy") == 0
    assert value(samples, "gateway_upstream_errors_total", kind="connect") == 1
    assert value(samples, "gateway_requests_total", key="dev", model="other", status="503") == 1
    assert eventually(lambda: value(scrape(gateway), "gateway_in_flight_requests") == 0)


def test_each_app_has_its_own_registry() -> None:
    first, second = GatewayMetrics(), GatewayMetrics()
    first.observe(RequestRecord(started=0.0, key="k", model="m", status=200), ended=0.5)
    assert b'gateway_requests_total{key="k",model="m",status="200"} 1.0' in first.render()
    assert b'key="k"' not in second.render()
    record = RequestRecord(started=0.0, key="k", model="m", status=0, refusal="rpm")
    first.observe(record, ended=0.1)
    assert b'status="499"' in first.render()
    assert b'gateway_quota_rejections_total{key="k",reason="rpm"} 1.0' in first.render()


def test_ledger_and_adapter_failures_are_counters_read_at_each_scrape() -> None:
    failures = [0]
    metrics = GatewayMetrics(
        usage_write_failures=lambda: failures[0], adapter_sync_errors=lambda: 2
    )
    text = metrics.render().decode()
    assert "gateway_usage_write_failures_total 0.0" in text
    assert "gateway_adapter_sync_errors_total 2.0" in text
    failures[0] = 3
    assert "gateway_usage_write_failures_total 3.0" in metrics.render().decode()
