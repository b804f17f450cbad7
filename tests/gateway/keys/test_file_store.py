from __future__ import annotations

import json
import os
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from serving.errors import ServingError
from serving.gateway.keys import FileKeyStore, KeyRecord, load_keys_file, render_keys_yaml
from serving.gateway.keys.credentials import hash_secret, new_secret
from serving.gateway.quota import Limits


def make_record(name: str) -> tuple[KeyRecord, str]:
    key_id, secret = new_secret()
    record = KeyRecord(
        key_id=key_id,
        name=name,
        secret_sha256=hash_secret(secret),
        created_at=datetime(2025, 3, 1, 12, 0, tzinfo=UTC),
        limits=Limits(rpm=60, max_tokens=256),
        models=("m1", "m2"),
        model_limits={"m1": Limits(tpm=1000)},
    )
    return record, secret


class Ticker:
    """A monotonic clock for the reload interval."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_rendered_yaml_loads_back_to_the_same_records(tmp_path: Path) -> None:
    first, secret = make_record("team-a")
    second = replace(
        make_record("team-b")[0],
        models=(),
        model_limits={},
        revoked=True,
        created_at=datetime(2025, 3, 2, tzinfo=UTC),
        weight=7,
        default_adapter="team-b-lora",
        priority=-2,
    )
    path = tmp_path / "keys.yaml"
    path.write_text(render_keys_yaml([first]) + render_keys_yaml([second]))
    assert load_keys_file(path) == {first.key_id: first, second.key_id: second}
    assert secret not in path.read_text()
    store = FileKeyStore(path)
    assert store.authenticate(secret) == first
    assert store.get(second.key_id) == second
    assert [record.key_id for record in store.list_keys()] == [first.key_id, second.key_id]


def test_rendered_entry_is_the_declarative_format() -> None:
    record, _ = make_record("team-a")
    assert render_keys_yaml([record]) == (
        "---\n"
        "keys:\n"
        f"- id: {record.key_id}\n"
        "  name: team-a\n"
        "  created_at: '2025-03-01T12:00:00Z'\n"
        f"  secret_sha256: {record.secret_sha256}\n"
        "  revoked: false\n"
        "  limits:\n"
        "    rpm: 60\n"
        "    max_tokens: 256\n"
        "  models:\n"
        "  - m1\n"
        "  - m2\n"
        "  model_limits:\n"
        "    m1:\n"
        "      tpm: 1000\n"
    )


def test_json_file_and_unquoted_yaml_timestamps(tmp_path: Path) -> None:
    record, secret = make_record("team-a")
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"keys": [record.to_document()]}))
    assert FileKeyStore(path).authenticate(secret) == record
    hand_written = tmp_path / "hand.yaml"
    hand_written.write_text(
        "keys:\n"
        f"  - id: {record.key_id}\n"
        "    name: ops\n"
        "    created_at: 2025-03-01T12:00:00Z\n"
        f"    secret_sha256: {record.secret_sha256}\n"
    )
    loaded = load_keys_file(hand_written)[record.key_id]
    assert loaded.created_at == record.created_at
    assert loaded.limits == Limits() and loaded.models == () and not loaded.revoked


def test_reload_when_the_file_changes(tmp_path: Path) -> None:
    first, first_secret = make_record("team-a")
    second, second_secret = make_record("team-b")
    path = tmp_path / "keys.yaml"
    path.write_text(render_keys_yaml([first]))
    ticker = Ticker()
    store = FileKeyStore(path, check_interval=1.0, monotonic=ticker)
    assert store.authenticate(first_secret) == first
    revoked = replace(first, revoked=True)
    path.write_text(render_keys_yaml([revoked, second]))
    os.utime(path, ns=(0, 10**18))  # mtime surely differs, whatever the clock's resolution
    ticker.now = 0.5
    assert store.authenticate(first_secret) == first  # not checked again within 1 s
    ticker.now = 1.0
    assert store.authenticate(first_secret) is None
    assert store.authenticate(second_secret) == second


def test_reload_through_a_swapped_symlink_like_a_kubernetes_secret(tmp_path: Path) -> None:
    record, secret = make_record("team-a")
    (tmp_path / "v1").mkdir()
    (tmp_path / "v1" / "keys.yaml").write_text(render_keys_yaml([]))
    (tmp_path / "data").symlink_to("v1")
    store = FileKeyStore(tmp_path / "data" / "keys.yaml", check_interval=0)
    assert store.authenticate(secret) is None
    (tmp_path / "v2").mkdir()
    (tmp_path / "v2" / "keys.yaml").write_text(render_keys_yaml([record]))
    (tmp_path / "data.tmp").symlink_to("v2")
    (tmp_path / "data.tmp").replace(tmp_path / "data")
    assert store.authenticate(secret) == record


def break_keys_file(path: Path) -> None:
    """An edit that does not parse, with a new mtime so a store checking now sees it."""
    path.write_text("keys: [ {id: oops\n")
    os.utime(path, ns=(0, 10**18))


def test_a_broken_edit_refuses_every_key_until_the_file_loads_again(tmp_path: Path) -> None:
    # The edit may have been a revocation written badly: keeping the last good keys would
    # keep the revoked key working (fail open).
    record, secret = make_record("team-a")
    path = tmp_path / "keys.yaml"
    path.write_text(render_keys_yaml([record]))
    store = FileKeyStore(path, check_interval=0)
    break_keys_file(path)
    assert not store.reload_if_changed()
    assert store.authenticate(secret) is None
    assert store.broken is not None and "not valid YAML/JSON" in store.broken
    assert secret not in store.broken
    path.unlink()
    assert store.authenticate(secret) is None
    path.write_text(render_keys_yaml([record]))
    assert store.authenticate(secret) == record
    assert store.broken is None


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("keys: [ {", "not valid YAML/JSON"),
        ("other: []", r"document 1 must be `keys: \[\.\.\.\]`"),
        ("keys:\n  - 5\n", r"keys\[0\]: a key entry must be a mapping"),
        ("keys:\n  - {id: nope}\n", r"keys\[0\]\.id must look like key_ab12cd34, got 'nope'"),
        (
            "keys:\n  - {id: key_ab12cd34, secret_sha256: abc}\n",
            r"keys\[0\] \(key_ab12cd34\)\.secret_sha256 must be 64 lowercase hex digits",
        ),
        (
            "keys:\n  - {id: key_ab12cd34, colour: red}\n",
            r"keys\[0\]: unknown field 'colour'",
        ),
    ],
)
def test_bad_files_name_the_problem(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text(content)
    with pytest.raises(ServingError, match=message):
        FileKeyStore(path)


def test_bad_limits_and_duplicates_name_the_entry(tmp_path: Path) -> None:
    record, _ = make_record("team-a")
    document = record.to_document()
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"keys": [{**document, "limits": {"rpm": -1}}]}))
    with pytest.raises(ServingError, match=rf"\({record.key_id}\)\.limits\.rpm must be a non-neg"):
        load_keys_file(path)
    path.write_text(json.dumps({"keys": [document, document]}))
    with pytest.raises(ServingError, match=f"key id {record.key_id} appears twice"):
        load_keys_file(path)
    with pytest.raises(ServingError, match=r"keys file .*missing\.yaml"):
        load_keys_file(tmp_path / "missing.yaml")
