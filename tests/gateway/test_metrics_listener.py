"""`--metrics-port`: every series on its own port; the API port's /metrics has the aggregate
ones only, with or without it."""

from __future__ import annotations

import httpx

from tests.gateway.conftest import GatewayFactory
from tests.gateway.servers import closed_port, http_client

PER_KEY = 'gateway_requests_total{key="dev",model="none",status="200"}'


def test_a_metrics_port_serves_the_per_key_series(make_gateway: GatewayFactory) -> None:
    port = closed_port()
    gateway = make_gateway(metrics_port=port)
    with http_client(gateway.url) as http:
        assert http.get("/v1/models").status_code == 200
    scraped = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    assert scraped.status_code == 200
    assert scraped.headers["content-type"].startswith("text/plain")
    assert PER_KEY in scraped.text
    assert httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).status_code == 404
    with http_client(gateway.url, key=None) as http:
        public = http.get("/metrics")
    assert public.status_code == 200
    assert public.headers["content-type"].startswith("text/plain")
    assert "gateway_in_flight_requests" in public.text
    assert 'key="' not in public.text and "gateway_requests_total" not in public.text


def test_without_a_metrics_port_no_per_key_series_are_served(
    make_gateway: GatewayFactory,
) -> None:
    gateway = make_gateway()
    with http_client(gateway.url) as http:
        assert http.get("/v1/models").status_code == 200
    with http_client(gateway.url, key=None) as http:
        scraped = http.get("/metrics")
    assert scraped.status_code == 200 and "gateway_in_flight_requests" in scraped.text
    assert 'key="' not in scraped.text
