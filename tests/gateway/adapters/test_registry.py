"""The adapter registry over SQLite and Redis: put, remove (a tombstone), put back, failures."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from serving.errors import ServingError
from serving.gateway.adapters.registry import (
    AdapterRegistry,
    AdapterStoreUnavailable,
    RedisAdapterRegistry,
    SqliteAdapterRegistry,
)
from tests.gateway.quota.redis_server import RedisServer
from tests.gateway.quota.running import run_async


async def _exercise(registry: AdapterRegistry) -> None:
    assert await registry.entries() == []
    first = await registry.put("team-a", "/adapters/a")
    await registry.put("team-b", "/adapters/b")
    assert [(e.name, e.path, e.loaded) for e in await registry.entries()] == [
        ("team-a", "/adapters/a", True),
        ("team-b", "/adapters/b", True),
    ]
    assert first.updated_at.endswith("Z")
    removed = await registry.remove("team-a")
    assert removed is not None and (removed.path, removed.loaded) == ("/adapters/a", False)
    assert await registry.remove("team-a") is None  # removed already
    assert await registry.remove("never") is None
    assert [(e.name, e.loaded) for e in await registry.entries()] == [
        ("team-a", False),
        ("team-b", True),
    ]
    await registry.put("team-a", "/adapters/a2")  # back, from another path
    entries = await registry.entries()
    assert entries[0].path == "/adapters/a2" and entries[0].loaded


@run_async
async def test_sqlite_registry(tmp_path: Path) -> None:
    registry = SqliteAdapterRegistry(tmp_path / "keys.db")
    try:
        await _exercise(registry)
    finally:
        await registry.close()
    again = SqliteAdapterRegistry(tmp_path / "keys.db")  # kept on disk
    assert [entry.name for entry in await again.entries()] == ["team-a", "team-b"]
    await again.close()


def test_sqlite_registry_that_cannot_open_says_where(tmp_path: Path) -> None:
    with pytest.raises(AdapterStoreUnavailable, match=r"keys\.db"):
        SqliteAdapterRegistry(tmp_path / "missing-dir" / "keys.db")


@run_async
async def test_redis_registry(redis_server: RedisServer) -> None:
    namespace = f"test-{uuid.uuid4().hex}:keys"
    registry = RedisAdapterRegistry.from_url(redis_server.url, namespace=namespace)
    try:
        await _exercise(registry)
        # another replica's view: the same entries
        other = RedisAdapterRegistry.from_url(redis_server.url, namespace=namespace)
        assert await other.entries() == await registry.entries()
        await other.close()
    finally:
        await registry.close()
    # The layout docs/architecture.md names: one hash, name -> {path, loaded, at}.
    with redis_server.admin(decode_responses=True) as admin:
        stored = admin.hgetall("{" + namespace + "}:lora_adapters")
    assert sorted(stored) == ["team-a", "team-b"]
    assert json.loads(stored["team-a"])["path"] == "/adapters/a2"


@run_async
async def test_a_damaged_entry_is_skipped(redis_server: RedisServer) -> None:
    namespace = f"test-{uuid.uuid4().hex}:keys"
    with redis_server.admin() as admin:
        admin.hset("{" + namespace + "}:lora_adapters", "broken", "not json")
    registry = RedisAdapterRegistry.from_url(redis_server.url, namespace=namespace)
    await registry.put("team-a", "/adapters/a")
    assert [entry.name for entry in await registry.entries()] == ["team-a"]
    await registry.close()


@pytest.mark.redis
@run_async
async def test_redis_registry_down_is_unavailable(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis", password="hunter2")
    server.start()
    registry = RedisAdapterRegistry.from_url(server.url, timeout_s=0.5)
    await registry.put("team-a", "/adapters/a")
    server.stop()
    with pytest.raises(AdapterStoreUnavailable, match="Redis") as raised:
        await registry.entries()
    assert "hunter2" not in str(raised.value)
    assert raised.value.__cause__ is None and raised.value.__suppress_context__
    await registry.close()


def test_a_bad_url_is_an_error_that_does_not_quote_it() -> None:
    for url in ("http://:hunter2@redis:6379", "redis://:hunter2@redis:port"):
        with pytest.raises(ServingError, match=r"^not a valid Redis URL$"):
            RedisAdapterRegistry.from_url(url)
