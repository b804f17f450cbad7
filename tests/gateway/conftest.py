"""Fixtures for gateway tests: one fake upstream per session, gateways per test."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest

from serving.gateway.settings import GatewaySettings
from tests.gateway.fake_upstream import FakeUpstream
from tests.gateway.servers import TEST_KEY, GatewayServer

GatewayFactory = Callable[..., GatewayServer]


@pytest.fixture(scope="session")
def upstream() -> Iterator[FakeUpstream]:
    fake = FakeUpstream()
    fake.start()
    yield fake
    fake.stop()


def start_gateway(upstream_url: str, **options: object) -> GatewayServer:
    """A started gateway for `upstream_url`; `options` override `GatewaySettings` fields."""
    defaults: dict[str, object] = {"upstream_idle_timeout_s": 5.0, "graceful_shutdown_s": 1}
    defaults.update(options)
    settings = GatewaySettings.create(upstream=upstream_url, api_keys=[TEST_KEY], **defaults)
    server = GatewayServer(settings)
    server.start()
    return server


@pytest.fixture(scope="module")
def gateway(upstream: FakeUpstream) -> Iterator[GatewayServer]:
    """A gateway with default settings, shared by a test module."""
    server = start_gateway(upstream.url)
    yield server
    server.stop()


@pytest.fixture
def make_gateway(upstream: FakeUpstream) -> Iterator[GatewayFactory]:
    """Start a gateway with other settings (`upstream=` too), stopped after the test."""
    started: list[GatewayServer] = []

    def make(**options: object) -> GatewayServer:
        url = str(options.pop("upstream", upstream.url))
        server = start_gateway(url, **options)
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()


@pytest.fixture
def token() -> str:
    """A fresh token that keys the fake upstream's gates and events for one test."""
    return uuid.uuid4().hex
