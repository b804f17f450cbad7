"""`--metrics-port`: /metrics on its own port, and a 404 on the API port."""

from __future__ import annotations

import httpx

from tests.gateway.conftest import GatewayFactory
from tests.gateway.servers import closed_port, http_client


def test_a_metrics_port_takes_metrics_off_the_api_port(make_gateway: GatewayFactory) -> None:
    port = closed_port()
    gateway = make_gateway(metrics_port=port)
    with http_client(gateway.url) as http:
        models = http.get("/v1/models")
        assert models.status_code == 200
        hidden = http.get("/metrics")
    assert hidden.status_code == 404
    assert hidden.json()["error"]["code"] == "unknown_url"  # as any path it does not serve
    scraped = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    assert scraped.status_code == 200
    assert scraped.headers["content-type"].startswith("text/plain")
    assert 'gateway_requests_total{key="dev",model="none",status="200"}' in scraped.text
    assert httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).status_code == 404


def test_without_a_metrics_port_the_api_port_serves_metrics(make_gateway: GatewayFactory) -> None:
    gateway = make_gateway()
    with http_client(gateway.url, key=None) as http:
        scraped = http.get("/metrics")
    assert scraped.status_code == 200 and "gateway_in_flight_requests" in scraped.text
