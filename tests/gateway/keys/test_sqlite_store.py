from __future__ import annotations

import multiprocessing
import sqlite3
import time
from datetime import timedelta
from pathlib import Path

import pytest

from serving.errors import ServingError
from serving.gateway.keys import SqliteKeyStore
from serving.gateway.keys.credentials import hash_secret, secret_matches
from serving.gateway.keys.record import KeySpec
from serving.gateway.keys.sqlite_store import DATA_VERSION_INTERVAL_S
from serving.gateway.quota import Limits


@pytest.fixture
def store(tmp_path: Path) -> SqliteKeyStore:
    return SqliteKeyStore(tmp_path / "keys.db")


def test_create_get_list_round_trip(store: SqliteKeyStore) -> None:
    record, secret = store.create(
        KeySpec(
            "team-a",
            limits=Limits(rpm=60, tpm=20_000, max_tokens=512),
            models=["m1", "m2"],
            model_limits={"m1": Limits(rpm=5)},
        )
    )
    assert record.secret_sha256 == hash_secret(secret)
    assert not record.revoked
    assert store.get(record.key_id) == record
    other, _ = store.create(KeySpec("team-b"), now=record.created_at + timedelta(seconds=1))
    assert store.list_keys() == [record, other]  # oldest first
    assert store.get("key_00000000") is None
    assert store.authenticate(secret) == record
    assert record.allows_model("m2") and not record.allows_model("m3")
    assert other.allows_model("anything")


def test_authenticate_rejects_wrong_malformed_unknown_and_revoked(store: SqliteKeyStore) -> None:
    record, secret = store.create(KeySpec("team-a"))
    wrong = secret[:-1] + ("a" if secret[-1] != "a" else "b")
    assert store.authenticate(wrong) is None
    assert store.authenticate("not a key") is None
    assert store.authenticate("sk-00000000-" + "a" * 40) is None
    store.revoke(record.key_id)
    assert store.authenticate(secret) is None


def test_authenticate_always_compares_digests(
    store: SqliteKeyStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, secret = store.create(KeySpec("team-a"))
    compared: list[str] = []

    def recording(presented: str, digest: str) -> bool:
        compared.append(digest)
        return secret_matches(presented, digest)

    monkeypatch.setattr("serving.gateway.keys.store.secret_matches", recording)
    store.authenticate(secret)
    store.authenticate("sk-00000000-" + "a" * 40)  # unknown id: compared against a dummy
    assert len(compared) == 2


def test_only_the_hash_is_at_rest(tmp_path: Path) -> None:
    path = tmp_path / "keys.db"
    store = SqliteKeyStore(path)
    secrets = [store.create(KeySpec(f"key-{n}"))[1] for n in range(5)]
    on_disk = b"".join(p.read_bytes() for p in tmp_path.iterdir())  # db, -wal, -shm
    store.close()
    on_disk += path.read_bytes()
    for secret in secrets:
        random_part = secret.rsplit("-", 1)[1].encode()
        assert secret.encode() not in on_disk
        assert random_part not in on_disk
        assert hash_secret(secret).encode() in on_disk
    assert path.stat().st_mode & 0o077 == 0  # owner-only file


def _settle_data_version() -> None:
    """Another connection's commits are seen within `DATA_VERSION_INTERVAL_S` (50 ms)."""
    time.sleep(DATA_VERSION_INTERVAL_S + 0.01)


def test_revoke_is_visible_to_another_store_on_the_same_file_at_once(tmp_path: Path) -> None:
    path = tmp_path / "keys.db"
    gateway = SqliteKeyStore(path)
    cli = SqliteKeyStore(path)
    record, secret = cli.create(KeySpec("team-a"))
    assert gateway.authenticate(secret) == record  # now cached in the gateway's store
    assert gateway.authenticate(secret) == record
    cli.revoke(record.key_id)
    _settle_data_version()
    assert gateway.authenticate(secret) is None
    assert gateway.get(record.key_id) is not None
    assert gateway.get(record.key_id).revoked  # type: ignore[union-attr]


def _revoke_in_another_process(path: str, key_id: str) -> None:
    SqliteKeyStore(Path(path)).revoke(key_id)


def test_revoke_from_another_process_is_seen_at_once(tmp_path: Path) -> None:
    path = tmp_path / "keys.db"
    gateway = SqliteKeyStore(path)
    record, secret = gateway.create(KeySpec("team-a"))
    assert gateway.authenticate(secret) == record
    process = multiprocessing.get_context("spawn").Process(
        target=_revoke_in_another_process, args=(str(path), record.key_id)
    )
    process.start()
    process.join(60)
    assert process.exitcode == 0
    _settle_data_version()
    assert gateway.authenticate(secret) is None


def test_revoke_twice_is_fine_and_unknown_id_is_an_error(store: SqliteKeyStore) -> None:
    record, _ = store.create(KeySpec("team-a"))
    assert store.revoke(record.key_id).revoked
    assert store.revoke(record.key_id).revoked
    with pytest.raises(ServingError, match="key id 'key_00000000': no such key"):
        store.revoke("key_00000000")


def test_create_validates_its_fields(store: SqliteKeyStore) -> None:
    with pytest.raises(ServingError, match=r"^name must be a non-empty string"):
        store.create(KeySpec("  "))
    with pytest.raises(ServingError, match=r"^model_limits: model 'm9' is not in the key's models"):
        store.create(KeySpec("x", models=["m1"], model_limits={"m9": Limits(rpm=1)}))
    assert store.list_keys() == []


def test_id_collisions_draw_a_new_id(
    store: SqliteKeyStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    from serving.gateway.keys import record as record_module

    first, _ = store.create(KeySpec("a"))
    draws = iter(
        [
            (first.key_id, "sk-" + first.key_id[4:] + "-" + "a" * 40),
            ("key_0000abcd", "sk-0000abcd-" + "b" * 40),
        ]
    )
    monkeypatch.setattr(record_module, "new_secret", lambda: next(draws))
    second, secret = store.create(KeySpec("b"))
    assert second.key_id == "key_0000abcd"
    assert store.authenticate(secret) == second


def test_a_second_process_schema_is_compatible(tmp_path: Path) -> None:
    path = tmp_path / "keys.db"
    SqliteKeyStore(path).create(KeySpec("a"))
    with sqlite3.connect(path) as conn:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    assert "api_keys" in tables
    assert len(SqliteKeyStore(path).list_keys()) == 1
