"""The embedded key store: one SQLite file shared by `serving keys` and a running gateway.

WAL mode lets the CLI write while the gateway reads. Revocation must take effect at once in
a running gateway, yet the gateway should not query per request more than it must: records
are cached and the whole cache is dropped whenever `PRAGMA data_version` says another
connection committed. That check runs at most once per `DATA_VERSION_INTERVAL_S` (50 ms)
rather than on every lookup, so a revocation (or any other change) made by another
connection takes effect within 50 ms: at once for practical purposes, and exact, unlike a
TTL. Under load this turns a SQLite statement per request into one per 50 ms.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from datetime import datetime
from pathlib import Path

from serving.errors import ServingError
from serving.gateway.keys.record import KeyRecord, KeySpec, format_time, new_records
from serving.gateway.keys.store import authenticate_with
from serving.gateway.quota.sqlite_db import connect

_SCHEMA = """
CREATE TABLE IF NOT EXISTS api_keys (
    key_id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    created_at TEXT NOT NULL,
    revoked INTEGER NOT NULL DEFAULT 0,
    secret_sha256 TEXT NOT NULL,
    policy TEXT NOT NULL  -- JSON: limits, models, model_limits as in the declarative form
)
"""
_COLUMNS = "key_id, name, created_at, revoked, secret_sha256, policy"
# How stale the cache may get: another connection's commits are seen within this long.
DATA_VERSION_INTERVAL_S = 0.05


class SqliteKeyStore:
    """Usage: `store = SqliteKeyStore(paths.keys_db_path())`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        # Hashes only, but still nobody else's business: create the file owner-only
        # (SQLite gives its -wal and -shm files the same mode).
        os.close(os.open(path, os.O_CREAT | os.O_RDWR, 0o600))
        self._conn = connect(path)
        self._lock = threading.Lock()
        self._cache: dict[str, KeyRecord] = {}
        with self._lock:
            # WAL so the CLI writes while gateways read; SQLite's own synchronous=FULL (not
            # connect_wal's NORMAL), so a created or revoked key survives a power cut.
            self._conn.execute("PRAGMA journal_mode = WAL")
            self._conn.execute(_SCHEMA)
            self._data_version = self._read_data_version()
            self._checked_at = time.monotonic()

    @property
    def location(self) -> str:
        return str(self.path)

    def get(self, key_id: str) -> KeyRecord | None:
        with self._lock:
            now = time.monotonic()
            if now - self._checked_at >= DATA_VERSION_INTERVAL_S:
                self._checked_at = now
                version = self._read_data_version()
                if version != self._data_version:
                    self._cache.clear()
                    self._data_version = version
            record = self._cache.get(key_id)
            if record is None:
                row = self._conn.execute(
                    f"SELECT {_COLUMNS} FROM api_keys WHERE key_id = ?", (key_id,)
                ).fetchone()
                if row is None:
                    return None  # unknown ids are not cached: they could fill memory
                record = self._cache[key_id] = _record(row)
            return record

    def list_keys(self) -> list[KeyRecord]:
        with self._lock:
            rows = self._conn.execute(
                f"SELECT {_COLUMNS} FROM api_keys ORDER BY created_at, key_id"
            ).fetchall()
        return [_record(row) for row in rows]

    def authenticate(self, secret: str) -> KeyRecord | None:
        return authenticate_with(self, secret)

    def create(self, spec: KeySpec, *, now: datetime | None = None) -> tuple[KeyRecord, str]:
        """Store a new key; returns it with its secret, which exists nowhere else."""
        candidates = new_records(spec, now=now)
        for record, secret in candidates:
            try:
                self._insert(record)
            except sqlite3.IntegrityError:
                continue  # id collision: draw another
            return record, secret
        raise ServingError(f"could not find a free key id in {self.path}")

    def revoke(self, key_id: str) -> KeyRecord:
        """Mark a key revoked (again is fine); unknown ids are an error naming the id."""
        with self._lock:
            self._conn.execute("UPDATE api_keys SET revoked = 1 WHERE key_id = ?", (key_id,))
            self._cache.pop(key_id, None)  # our own writes do not change data_version
        record = self.get(key_id)
        if record is None:
            raise ServingError(f"key id {key_id!r}: no such key in {self.path}")
        return record

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def _insert(self, record: KeyRecord) -> None:
        document = record.to_document()
        policy = {
            name: document[name]
            for name in (
                "limits",
                "models",
                "model_limits",
                "weight",
                "default_adapter",
                "priority",
            )
            if name in document
        }
        with self._lock:
            self._conn.execute(
                f"INSERT INTO api_keys ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)",
                (
                    record.key_id,
                    record.name,
                    format_time(record.created_at),
                    int(record.revoked),
                    record.secret_sha256,
                    json.dumps(policy, sort_keys=True),
                ),
            )

    def _read_data_version(self) -> int:
        row = self._conn.execute("PRAGMA data_version").fetchone()
        return int(row[0])


def _record(row: tuple[str, str, str, int, str, str]) -> KeyRecord:
    key_id, name, created_at, revoked, secret_sha256, policy = row
    document = {
        "id": key_id,
        "name": name,
        "created_at": created_at,
        "revoked": bool(revoked),
        "secret_sha256": secret_sha256,
        **json.loads(policy),
    }
    return KeyRecord.from_document(document, where=f"key store row {key_id}")
