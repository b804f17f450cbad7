"""Redis for the usage ledger's tests: one `redis-server` for the session (each test under a
namespace of its own), and one of a test's own for a test that pauses or kills it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gateway.quota.redis_server import RedisServer


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis-usage"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test's own, free to be paused, killed and started again."""
    server = RedisServer(tmp_path / "redis")
    server.start()
    yield server
    server.stop()
