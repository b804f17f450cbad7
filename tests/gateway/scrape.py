"""Reading a gateway's metrics and quota state in tests."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from serving.gateway.quota import Scope
from tests.gateway.conftest import eventually
from tests.gateway.servers import GatewayServer

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(gateway: GatewayServer) -> Samples:
    """Every series, per key too, as the metrics port serves them (rendered in the serving
    loop, as it does): the API port's /metrics has the aggregate ones only, and a metrics
    port per test gateway would be one more port to find free (test_metrics_listener.py
    scrapes a real one)."""
    text = gateway.in_loop(gateway.app.metrics.render).decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def idle(gateway: GatewayServer) -> bool:
    """No request in flight and no quota lease held (docs/architecture.md, reliability case 18)."""
    samples = scrape(gateway)
    return (
        value(samples, "gateway_in_flight_requests") == 0
        and value(samples, "gateway_quota_leases") == 0
        and gateway.in_loop(gateway.app.quota.store.active_leases) == 0
    )


def settled(gateway: GatewayServer) -> bool:
    """Wait until the gateway is idle; True once it is."""
    return eventually(lambda: idle(gateway))


def key_usage(gateway: GatewayServer, key_id: str) -> tuple[int, int, int, int]:
    """(in flight, requests in window, tokens in window, tokens today) of a key."""
    usage = gateway.await_in_loop(lambda: gateway.app.quota.store.usage(Scope(key_id)))
    return usage.in_flight, usage.requests_in_window, usage.tokens_in_window, usage.tokens_today
