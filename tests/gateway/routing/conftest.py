"""Fixtures of the routing tests: a real DNS server for engine discovery."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gateway.routing.dns_server import DnsServer


@pytest.fixture
def dns_server(tmp_path: Path) -> Iterator[DnsServer]:
    with DnsServer(tmp_path) as server:
        yield server
