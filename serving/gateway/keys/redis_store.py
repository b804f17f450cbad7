"""Keys in Redis: one store shared by every gateway replica and by `serving keys --redis-url`.

    store = RedisKeyStore.from_url("redis://:PASSWORD@redis:6379/0")
    await store.refresh()                                # load, or reload if anything changed
    record, secret = await store.create(KeySpec("team-a", limits=Limits(rpm=60)))
    store.authenticate(secret)                           # from memory: no round trip

Layout, under `{NAMESPACE}` (default `qwen-serving:keys`): `:records`, a hash (key id -> the
record as JSON: the secret's SHA-256, never the secret); `:revoked`, a set of key ids; `:version`,
a random token replaced in the MULTI of every change. Lookups answer from the snapshot the last
`refresh` loaded; the gateway refreshes every second (`redis_refresh`), so a key created or
revoked anywhere takes effect in every replica within about a second. While Redis is unreachable
the snapshot stays; every `RedisError` becomes `KeyStoreUnavailable`, which names no password.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from serving.errors import ServingError
from serving.gateway.failures import GatewayException
from serving.gateway.keys.record import KeyRecord, KeySpec, new_records
from serving.gateway.keys.store import authenticate_with
from serving.gateway.quota.redis_client import RedisClient
from serving.gateway.quota.redis_connection import RedisError

log = logging.getLogger(__name__)

DEFAULT_NAMESPACE = "qwen-serving:keys"
# Off the request path: generous, so a busy Redis is waited for, a lost one not for long.
# Also the usage ledger's and the adapter registry's, which are off it too.
DEFAULT_TIMEOUT_S = 2.0
URL_FORMS = "redis://[:PASSWORD@]HOST[:PORT][/DB], rediss://... or unix://PATH"


class KeyStoreUnavailable(GatewayException, ServingError):
    """Redis did not answer, or refused; the message holds no password and no key."""


@dataclass(frozen=True, slots=True)
class _Snapshot:
    """Swapped whole, so a reader never pairs one load's records with another's version."""

    version: str | None
    records: Mapping[str, KeyRecord] = field(default_factory=dict)


# Before the first load: a version no Redis has (a missing version key reads as None).
_UNLOADED = _Snapshot(version="")


class RedisKeyStore:
    """Usage: `RedisKeyStore.from_url(url)`; nothing is read until `refresh`. The calls that
    reach Redis are coroutines on the gateway's event loop, over a client (one connection) of
    the store's own; `serving keys` runs them through `BlockingRedisKeyStore`."""

    def __init__(self, client: RedisClient, *, namespace: str = DEFAULT_NAMESPACE) -> None:
        self._client = client
        # A hash tag: in a Redis Cluster the three keys share one slot, so one MULTI may span them.
        tag = "{" + namespace + "}"
        self._records_key = f"{tag}:records"
        self._revoked_key = f"{tag}:revoked"
        self._version_key = f"{tag}:version"
        self._snapshot = _UNLOADED

    @classmethod
    def from_url(
        cls, url: str, *, timeout_s: float = DEFAULT_TIMEOUT_S, namespace: str = DEFAULT_NAMESPACE
    ) -> RedisKeyStore:
        try:
            client = RedisClient.from_url(url, timeout_s=timeout_s)
        except ValueError:
            # One message for every malformed URL, and never the URL: it may hold a password.
            raise ServingError(f"not a valid Redis URL (expected {URL_FORMS})") from None
        return cls(client, namespace=namespace)

    @property
    def location(self) -> str:
        endpoint = self._client.endpoint
        if endpoint.unix_path is not None:
            return f"Redis at unix:{endpoint.unix_path}"
        return f"Redis at {endpoint.host}:{endpoint.port}/{endpoint.db}"

    @property
    def loaded(self) -> bool:
        return self._snapshot is not _UNLOADED

    def get(self, key_id: str) -> KeyRecord | None:
        return self._snapshot.records.get(key_id)

    def list_keys(self) -> list[KeyRecord]:
        records = self._snapshot.records.values()
        return sorted(records, key=lambda record: (record.created_at, record.key_id))

    def authenticate(self, secret: str) -> KeyRecord | None:
        return authenticate_with(self, secret)

    async def refresh(self) -> bool:
        """Load the keys if they changed since the last load; True if a new snapshot was
        loaded. One GET of the version, and one MULTI for everything only when it moved.
        `KeyStoreUnavailable` if Redis cannot answer: the old snapshot stays, so known keys
        keep working and revocations wait. A Redis that comes back empty (no persistence)
        empties the snapshot, as it should: give it persistence."""
        with self._redis_errors():
            if await self._client.call("GET", self._version_key) == self._snapshot.version:
                return False
            version, documents, revoked = await self._client.transaction(
                ("GET", self._version_key),
                ("HGETALL", self._records_key),
                ("SMEMBERS", self._revoked_key),
            )
        pairs = list(documents)
        fields = dict(zip(pairs[::2], pairs[1::2], strict=True))
        self._snapshot = _Snapshot(version, _parse(fields, set(revoked)))
        return True

    async def create(self, spec: KeySpec, *, now: datetime | None = None) -> tuple[KeyRecord, str]:
        """Store a new key; returns it with its secret, which exists nowhere else."""
        candidates = new_records(spec, now=now)
        for record, secret in candidates:
            with self._redis_errors():
                # HSETNX: an id another writer took is never overwritten. Bumping the
                # version for a collision too costs readers one needless reload, nothing more.
                added, _ = await self._client.transaction(
                    ("HSETNX", self._records_key, record.key_id, _encode(record)),
                    ("SET", self._version_key, _new_version()),
                )
            if added:
                await self.refresh()  # the writer sees its own write at once, as with SQLite
                return record, secret
        raise ServingError(f"could not find a free key id in {self.location}")

    async def revoke(self, key_id: str) -> KeyRecord:
        """Mark a key revoked (again is fine); unknown ids are an error naming the id."""
        with self._redis_errors():
            # Records are never deleted, so one that exists now still exists at the SADD.
            exists = await self._client.call("HEXISTS", self._records_key, key_id)
            if exists:
                # A set: a revocation is one SADD, nothing to read back, and twice is harmless.
                await self._client.transaction(
                    ("SADD", self._revoked_key, key_id),
                    ("SET", self._version_key, _new_version()),
                )
        if not exists:
            raise ServingError(f"key id {key_id!r}: no such key in {self.location}")
        await self.refresh()
        record = self.get(key_id)
        if record is None:  # stored, but does not parse (logged by `refresh`)
            raise ServingError(f"key id {key_id!r}: revoked, but its record in Redis is invalid")
        return record

    def close(self) -> None:
        """`KeyStore.close`, which the gateway calls off its event loop: nothing to do there.
        The connection belongs to the loop that opened it; `aclose` (which the gateway's
        refresh calls as it stops) closes it."""

    async def aclose(self) -> None:
        """Close the connection to Redis; the snapshot stays, and lookups keep answering."""
        await self._client.close()

    @contextmanager
    def _redis_errors(self) -> Iterator[None]:
        try:
            yield
        except RedisError as exc:
            # `from None`: no chained message travels with it (`_describe` masks the password).
            raise KeyStoreUnavailable(
                f"{self.location} is unavailable ({self._describe(exc)})"
            ) from None

    def _describe(self, exc: RedisError) -> str:
        lines = str(exc).splitlines()
        text = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
        # The client's messages name no URL and no password; this makes sure of it.
        password = self._client.endpoint.password
        return text.replace(password, "***") if password else text


class BlockingRedisKeyStore:
    """A `RedisKeyStore` with blocking calls, a `WritableKeyStore` for `serving keys`: each
    call runs to its end on an event loop of its own (`asyncio.Runner`), which keeps the
    connection between calls. Not for a thread with a running loop (a gateway)."""

    def __init__(self, store: RedisKeyStore) -> None:
        self.store = store
        self._runner = asyncio.Runner()

    @classmethod
    def from_url(
        cls, url: str, *, timeout_s: float = DEFAULT_TIMEOUT_S, namespace: str = DEFAULT_NAMESPACE
    ) -> BlockingRedisKeyStore:
        return cls(RedisKeyStore.from_url(url, timeout_s=timeout_s, namespace=namespace))

    @property
    def location(self) -> str:
        return self.store.location

    @property
    def loaded(self) -> bool:
        return self.store.loaded

    def get(self, key_id: str) -> KeyRecord | None:
        return self.store.get(key_id)

    def list_keys(self) -> list[KeyRecord]:
        return self.store.list_keys()

    def authenticate(self, secret: str) -> KeyRecord | None:
        return self.store.authenticate(secret)

    def refresh(self) -> bool:
        return self._runner.run(self.store.refresh())

    def create(self, spec: KeySpec, *, now: datetime | None = None) -> tuple[KeyRecord, str]:
        return self._runner.run(self.store.create(spec, now=now))

    def revoke(self, key_id: str) -> KeyRecord:
        return self._runner.run(self.store.revoke(key_id))

    def close(self) -> None:
        try:
            self._runner.run(self.store.aclose())
        finally:
            self._runner.close()


def _encode(record: KeyRecord) -> str:
    document = record.to_document()
    del document["revoked"]  # the revoked set says that
    return json.dumps(document, sort_keys=True)


def _parse(documents: Mapping[str, str], revoked: set[str]) -> dict[str, KeyRecord]:
    """A record that does not parse is left out (its key fails closed) and logged by its id;
    every other key and every revocation still loads."""
    records: dict[str, KeyRecord] = {}
    for key_id, text in documents.items():
        try:
            document: Any = json.loads(text)
            if isinstance(document, dict):
                document["revoked"] = key_id in revoked
            record = KeyRecord.from_document(document, where=f"Redis record {key_id!r}")
        except (ValueError, ServingError) as exc:
            # Safe to log: a record holds no secret, and the one error about its digest
            # does not quote the digest.
            log.error("leaving out key %r: its record in Redis is invalid: %s", key_id, exc)
            continue
        if record.key_id != key_id:
            log.error("leaving out key %r: its record in Redis names %r", key_id, record.key_id)
            continue
        records[key_id] = record
    return records


def _new_version() -> str:
    """A random token, not a counter: a Redis restarted empty, or a lagging replica failed
    over to, can bring a counter back to a number a gateway has already seen."""
    return secrets.token_hex(8)
