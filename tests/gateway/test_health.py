"""The health monitor: what /readyz serves, the health gauge and the model catalog."""

from __future__ import annotations

import asyncio

from serving.gateway.catalog import ModelCatalog
from serving.gateway.health import NOT_CHECKED, HealthMonitor
from serving.gateway.metrics import GatewayMetrics
from serving.gateway.routing import Engine, Router
from serving.gateway.settings import GatewaySettings
from serving.gateway.upstream import UpstreamClient
from tests.gateway.fake_upstream import FakeUpstream
from tests.gateway.servers import TEST_KEY, closed_port


async def checked(url: str, *, rounds: int = 1) -> tuple[HealthMonitor, ModelCatalog, float]:
    settings = GatewaySettings.create(upstream=url, api_keys=[TEST_KEY])
    client = UpstreamClient(settings, url)
    router = Router([Engine(client)], policy="affinity", overload=8)
    catalog, metrics = ModelCatalog(), GatewayMetrics()
    monitor = HealthMonitor(router, catalog, metrics, interval_s=3600)
    await client.start()
    try:
        assert monitor.unready_reason == NOT_CHECKED  # not ready before the first check
        for _ in range(rounds):
            await monitor.check()
    finally:
        await client.close()
    return monitor, catalog, metrics.upstream_healthy


def test_a_healthy_upstream_is_ready_and_its_models_are_learned(upstream: FakeUpstream) -> None:
    monitor, catalog, gauge = asyncio.run(checked(upstream.url))
    assert monitor.unready_reason is None
    assert gauge == 1
    assert catalog.context_window("fake") == 2048
    assert catalog.label("fake") == "fake"


def test_an_unhealthy_upstream_says_why_and_its_models_are_not_read(
    upstream: FakeUpstream,
) -> None:
    upstream.healthy = False
    try:
        monitor, catalog, gauge = asyncio.run(checked(upstream.url))
    finally:
        upstream.healthy = True
    assert monitor.unready_reason == "upstream /health answered 503"
    assert gauge == 0
    assert catalog.context_window("fake") is None


def test_an_unreachable_upstream_is_not_ready() -> None:
    monitor, _, gauge = asyncio.run(checked(f"http://127.0.0.1:{closed_port()}"))
    assert monitor.unready_reason is not None
    assert monitor.unready_reason.startswith("upstream /health failed")
    assert gauge == 0
