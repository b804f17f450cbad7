"""The adapters an operator loaded at run time, kept where the keys are: SQLite or Redis.

    registry = SqliteAdapterRegistry(Path("keys.db"))     # or RedisAdapterRegistry.from_url(url)
    await registry.put("team-a-lora", "/adapters/team-a")  # every engine should hold it
    await registry.remove("team-a-lora")                   # every engine should drop it
    await registry.entries()                               # both kinds, by name
    await registry.close()

Kept, not just sent to the engines once: an engine that starts later (a replica KEDA adds, a
restarted pod: vLLM forgets runtime adapters when it stops) gets them from the gateways'
`sync`, and every gateway replica sharing the store sends requests the same way. A removed
adapter stays as a tombstone, so an engine that missed the unload (unreachable then) is
unloaded when it is seen again; putting the name back replaces the tombstone.

The calls are coroutines, awaited on the gateway's event loop: SQLite's run in a worker
thread; Redis's go through the gateway's own client (`quota.redis_client`, a connection of
the registry's own), whose failures (`RedisError`) become `AdapterStoreUnavailable`.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from serving.errors import ServingError
from serving.gateway.failures import GatewayException
from serving.gateway.keys.redis_store import DEFAULT_NAMESPACE, DEFAULT_TIMEOUT_S
from serving.gateway.quota.redis_client import RedisClient
from serving.gateway.quota.redis_connection import RedisError
from serving.gateway.quota.sqlite_db import connect


class AdapterStoreUnavailable(GatewayException, ServingError):
    """The store could not be read or written (Redis down, the file locked)."""


@dataclass(frozen=True, slots=True)
class AdapterEntry:
    name: str
    path: str
    """Where the engines load it from: a directory on the engines' filesystem."""
    loaded: bool
    """False: removed (a tombstone)."""
    updated_at: str


class AdapterRegistry(Protocol):
    async def entries(self) -> list[AdapterEntry]: ...

    async def put(self, name: str, path: str) -> AdapterEntry: ...

    async def remove(self, name: str) -> AdapterEntry | None:
        """Mark `name` removed; None when it was never loaded (or is removed already)."""
        ...

    async def close(self) -> None: ...


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


_SCHEMA = """
CREATE TABLE IF NOT EXISTS lora_adapters (
    name TEXT PRIMARY KEY,
    path TEXT NOT NULL,
    loaded INTEGER NOT NULL,
    updated_at TEXT NOT NULL
)
"""


class SqliteAdapterRegistry:
    """A table in keys.db (`serving keys`' file), shared by the gateways on one machine."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        try:
            self._conn = connect(path)
            self._conn.execute(_SCHEMA)
            self._conn.commit()
        except sqlite3.Error as exc:
            raise AdapterStoreUnavailable(f"{path}: {exc}") from None

    async def entries(self) -> list[AdapterEntry]:
        return await asyncio.to_thread(self._entries)

    async def put(self, name: str, path: str) -> AdapterEntry:
        return await asyncio.to_thread(self._put, name, path)

    async def remove(self, name: str) -> AdapterEntry | None:
        return await asyncio.to_thread(self._remove, name)

    async def close(self) -> None:
        await asyncio.to_thread(self._close)

    def _entries(self) -> list[AdapterEntry]:
        with self._lock, self._errors():
            rows = self._conn.execute(
                "SELECT name, path, loaded, updated_at FROM lora_adapters ORDER BY name"
            ).fetchall()
        return [AdapterEntry(name, path, bool(loaded), at) for name, path, loaded, at in rows]

    def _put(self, name: str, path: str) -> AdapterEntry:
        entry = AdapterEntry(name, path, True, _now())
        with self._lock, self._errors(), self._conn:
            self._conn.execute(
                "INSERT INTO lora_adapters (name, path, loaded, updated_at) VALUES (?, ?, 1, ?)"
                " ON CONFLICT(name) DO UPDATE SET path = excluded.path, loaded = 1,"
                " updated_at = excluded.updated_at",
                (name, path, entry.updated_at),
            )
        return entry

    def _remove(self, name: str) -> AdapterEntry | None:
        at = _now()
        with self._lock, self._errors(), self._conn:
            row = self._conn.execute(
                "UPDATE lora_adapters SET loaded = 0, updated_at = ? WHERE name = ? AND loaded = 1"
                " RETURNING path",
                (at, name),
            ).fetchone()
        return None if row is None else AdapterEntry(name, row[0], False, at)

    def _close(self) -> None:
        with self._lock:
            self._conn.close()

    def _errors(self) -> _Translate:
        return _Translate(sqlite3.Error, str(self.path))


class RedisAdapterRegistry:
    """A hash in the Redis the gateway replicas share: name -> {path, loaded, updated_at}."""

    def __init__(self, client: RedisClient, *, namespace: str = DEFAULT_NAMESPACE) -> None:
        self._client = client
        self._key = "{" + namespace + "}:lora_adapters"

    @classmethod
    def from_url(
        cls, url: str, *, timeout_s: float = DEFAULT_TIMEOUT_S, namespace: str = DEFAULT_NAMESPACE
    ) -> RedisAdapterRegistry:
        try:
            client = RedisClient.from_url(url, timeout_s=timeout_s)
        except ValueError:
            raise ServingError("not a valid Redis URL") from None  # never the URL: a password
        return cls(client, namespace=namespace)

    async def entries(self) -> list[AdapterEntry]:
        with self._errors():
            reply = list(await self._client.call("HGETALL", self._key))
        raw = dict(zip(reply[::2], reply[1::2], strict=True))
        entries = []
        for name, text in sorted(raw.items()):
            try:
                data = json.loads(text)
                entries.append(
                    AdapterEntry(name, str(data["path"]), bool(data["loaded"]), str(data["at"]))
                )
            except (ValueError, KeyError, TypeError):
                continue  # not ours to interpret: a damaged entry is skipped, not fatal
        return entries

    async def put(self, name: str, path: str) -> AdapterEntry:
        entry = AdapterEntry(name, path, True, _now())
        with self._errors():
            await self._client.call("HSET", self._key, name, _encode(entry))
        return entry

    async def remove(self, name: str) -> AdapterEntry | None:
        entries = await self.entries()
        current = next((e for e in entries if e.name == name and e.loaded), None)
        if current is None:
            return None
        entry = AdapterEntry(name, current.path, False, _now())
        with self._errors():
            await self._client.call("HSET", self._key, name, _encode(entry))
        return entry

    async def close(self) -> None:
        await self._client.close()

    def _errors(self) -> _Translate:
        return _Translate(RedisError, "Redis")


def _encode(entry: AdapterEntry) -> str:
    return json.dumps({"path": entry.path, "loaded": entry.loaded, "at": entry.updated_at})


class _Translate:
    """Turns the backend's errors into `AdapterStoreUnavailable` naming the store."""

    def __init__(self, kind: type[Exception], where: str) -> None:
        self._kind = kind
        self._where = where

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, value: object, tb: object) -> None:
        if value is not None and isinstance(value, self._kind):
            raise AdapterStoreUnavailable(
                f"the adapter store ({self._where}) is unavailable: {type(value).__name__}"
            ) from None
