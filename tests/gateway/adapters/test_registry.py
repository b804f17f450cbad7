"""The adapter registry over SQLite and Redis: put, remove (a tombstone), put back, failures."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis import Redis

from serving.gateway.adapters.registry import (
    AdapterRegistry,
    AdapterStoreUnavailable,
    RedisAdapterRegistry,
    SqliteAdapterRegistry,
)
from tests.gateway.quota.redis_server import RedisServer


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis-adapters"))
    server.start()
    yield server
    server.stop()


def _exercise(registry: AdapterRegistry) -> None:
    assert registry.entries() == []
    first = registry.put("team-a", "/adapters/a")
    registry.put("team-b", "/adapters/b")
    assert [(e.name, e.path, e.loaded) for e in registry.entries()] == [
        ("team-a", "/adapters/a", True),
        ("team-b", "/adapters/b", True),
    ]
    assert first.updated_at.endswith("Z")
    removed = registry.remove("team-a")
    assert removed is not None and (removed.path, removed.loaded) == ("/adapters/a", False)
    assert registry.remove("team-a") is None  # removed already
    assert registry.remove("never") is None
    assert [(e.name, e.loaded) for e in registry.entries()] == [
        ("team-a", False),
        ("team-b", True),
    ]
    registry.put("team-a", "/adapters/a2")  # back, from another path
    assert registry.entries()[0].path == "/adapters/a2" and registry.entries()[0].loaded


def test_sqlite_registry(tmp_path: Path) -> None:
    registry = SqliteAdapterRegistry(tmp_path / "keys.db")
    try:
        _exercise(registry)
    finally:
        registry.close()
    again = SqliteAdapterRegistry(tmp_path / "keys.db")  # kept on disk
    assert [entry.name for entry in again.entries()] == ["team-a", "team-b"]
    again.close()


def test_sqlite_registry_that_cannot_open_says_where(tmp_path: Path) -> None:
    with pytest.raises(AdapterStoreUnavailable, match=r"keys\.db"):
        SqliteAdapterRegistry(tmp_path / "missing-dir" / "keys.db")


def test_redis_registry(redis_server: RedisServer) -> None:
    namespace = f"test-{uuid.uuid4().hex}:keys"
    registry = RedisAdapterRegistry(Redis.from_url(redis_server.url, decode_responses=True),
                                    namespace=namespace)  # fmt: skip
    try:
        _exercise(registry)
        # another replica's view: the same entries
        other = RedisAdapterRegistry(
            Redis.from_url(redis_server.url, decode_responses=True), namespace=namespace
        )
        assert other.entries() == registry.entries()
        other.close()
    finally:
        registry.close()


@pytest.mark.redis
def test_redis_registry_down_is_unavailable(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis")
    server.start()
    registry = RedisAdapterRegistry.from_url(server.url, timeout_s=0.5)
    registry.put("team-a", "/adapters/a")
    server.stop()
    with pytest.raises(AdapterStoreUnavailable, match="Redis"):
        registry.entries()
    registry.close()
