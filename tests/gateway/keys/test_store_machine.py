"""Random runs of create, revoke, lookups and a gateway's refresh, over the SQLite store and
the Redis store alike and checked against one model, so the two keep the same semantics.

Two stores share the keys in each run: the writer (`serving keys`) and the reader (a
gateway's). Invariants: the writer sees its own writes at once; the reader, once synced
(Redis: a refresh; SQLite: its data_version check, made to run on every lookup here), sees
exactly what the model holds; a secret authenticates exactly while its key is not revoked,
and a wrong or unknown one never does.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)

from serving.errors import ServingError
from serving.gateway.keys import sqlite_store
from serving.gateway.keys.credentials import hash_secret
from serving.gateway.keys.record import KeyRecord, KeySpec
from serving.gateway.keys.redis_store import BlockingRedisKeyStore
from serving.gateway.keys.sqlite_store import SqliteKeyStore
from serving.gateway.keys.store import KeyStore, WritableKeyStore
from serving.gateway.quota import Limits
from tests.gateway.quota.redis_server import RedisServer

MODELS = ("m1", "m2", "m3")
UNKNOWN_ID = "key_00000000"


class KeyStoreMachine(RuleBasedStateMachine):
    keys = Bundle("keys")

    def __init__(self) -> None:
        super().__init__()
        self.writer, self.reader = self.open_stores()
        self.records: dict[str, KeyRecord] = {}  # the model: every key as it is now
        self.secrets: dict[str, str] = {}

    def open_stores(self) -> tuple[WritableKeyStore, KeyStore]:
        raise NotImplementedError

    def sync_reader(self) -> None:
        raise NotImplementedError

    @rule(
        target=keys,
        name=st.sampled_from(["team-a", "team-b", "batch"]),
        rpm=st.none() | st.integers(0, 1000),
        max_tokens=st.none() | st.integers(1, 4096),
        models=st.lists(st.sampled_from(MODELS), unique=True, max_size=2),
        model_rpm=st.none() | st.integers(0, 10),
    )
    def create(
        self,
        name: str,
        rpm: int | None,
        max_tokens: int | None,
        models: list[str],
        model_rpm: int | None,
    ) -> str:
        model_limits = {models[0]: Limits(rpm=model_rpm)} if models and model_rpm else {}
        record, secret = self.writer.create(
            KeySpec(
                name,
                limits=Limits(rpm=rpm, max_tokens=max_tokens),
                models=models,
                model_limits=model_limits,
            )
        )
        assert record.secret_sha256 == hash_secret(secret) and not record.revoked
        assert record.key_id not in self.records
        assert (record.name, record.models, record.model_limits) == (
            name,
            tuple(models),
            model_limits,
        )
        self.records[record.key_id] = record
        self.secrets[record.key_id] = secret
        return record.key_id

    @rule(key_id=keys)
    def revoke(self, key_id: str) -> None:
        revoked = self.writer.revoke(key_id)
        self.records[key_id] = replace(self.records[key_id], revoked=True)
        assert revoked == self.records[key_id]

    @rule()
    def revoke_an_unknown_key(self) -> None:
        with pytest.raises(ServingError, match=f"key id '{UNKNOWN_ID}': no such key in"):
            self.writer.revoke(UNKNOWN_ID)

    @rule()
    def sync(self) -> None:
        self.sync_reader()
        for key_id, record in self.records.items():
            assert self.reader.get(key_id) == record
            expected = None if record.revoked else record
            assert self.reader.authenticate(self.secrets[key_id]) == expected
        assert self.reader.list_keys() == self.expected_list()

    @rule(key_id=keys, position=st.integers(12, 51))
    def wrong_secret(self, key_id: str, position: int) -> None:
        secret = self.secrets[key_id]
        wrong = secret[:position] + ("a" if secret[position] != "a" else "b")
        wrong += secret[position + 1 :]
        assert self.writer.authenticate(wrong) is None
        assert self.reader.authenticate(wrong) is None

    @invariant()
    def the_writer_sees_its_own_writes(self) -> None:
        assert self.writer.list_keys() == self.expected_list()
        for key_id, record in self.records.items():
            assert self.writer.get(key_id) == record
            expected = None if record.revoked else record
            assert self.writer.authenticate(self.secrets[key_id]) == expected
        assert self.writer.get(UNKNOWN_ID) is None
        assert self.writer.authenticate("sk-00000000-" + "a" * 40) is None

    def expected_list(self) -> list[KeyRecord]:
        return sorted(self.records.values(), key=lambda r: (r.created_at, r.key_id))

    def teardown(self) -> None:
        self.writer.close()
        self.reader.close()


SETTINGS = settings(max_examples=40, stateful_step_count=25, deadline=None, database=None)


def test_the_sqlite_store(monkeypatch: pytest.MonkeyPatch) -> None:
    # A reader checks data_version on every lookup, so "synced" means "now" (it is 50 ms).
    monkeypatch.setattr(sqlite_store, "DATA_VERSION_INTERVAL_S", 0.0)

    class OverSqlite(KeyStoreMachine):
        def open_stores(self) -> tuple[WritableKeyStore, KeyStore]:
            self.directory = Path(tempfile.mkdtemp(prefix="keys-machine-"))
            path = self.directory / "keys.db"
            return SqliteKeyStore(path), SqliteKeyStore(path)

        def sync_reader(self) -> None:
            pass

        def teardown(self) -> None:
            super().teardown()
            shutil.rmtree(self.directory)

    run_state_machine_as_test(OverSqlite, settings=SETTINGS)


def test_the_redis_store(redis_server: RedisServer) -> None:
    class OverRedis(KeyStoreMachine):
        def open_stores(self) -> tuple[WritableKeyStore, KeyStore]:
            namespace = f"machine-{uuid.uuid4().hex}"
            self.reader_store = BlockingRedisKeyStore.from_url(
                redis_server.url, namespace=namespace
            )
            writer = BlockingRedisKeyStore.from_url(redis_server.url, namespace=namespace)
            writer.refresh()
            return writer, self.reader_store

        def sync_reader(self) -> None:
            self.reader_store.refresh()

    run_state_machine_as_test(OverRedis, settings=SETTINGS)
