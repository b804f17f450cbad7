"""`serving batches list` through `serving.cli.main`: every key's batches from the batch
database beside keys.db, newest first, with key names; filtered by status and key; as JSON;
bad input is one line naming the flag (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from serving import cli
from serving.gateway.batches.objects import BatchRow
from serving.gateway.batches.store import DB_NAME, BatchStore
from serving.gateway.keys import SqliteKeyStore
from serving.gateway.keys.record import KeySpec

CREATED = 1_780_000_000  # 2026-05-28 20:26 UTC


def serving(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def keys_db(tmp_path: Path) -> tuple[Path, str, str]:
    """keys.db with two keys, and batches.db beside it: one batch of the first key in
    progress, one completed, and one of the second key failed (oldest to newest)."""
    keys = SqliteKeyStore(tmp_path / "keys.db")
    team_a, _ = keys.create(KeySpec("team-a"))
    team_b, _ = keys.create(KeySpec("team-b"))
    keys.close()
    store = BatchStore(tmp_path / DB_NAME)
    for n, (key_id, status, counts) in enumerate(
        [
            (team_a.key_id, "in_progress", (10, 4, 1)),
            (team_a.key_id, "completed", (3, 3, 0)),
            (team_b.key_id, "failed", (0, 0, 0)),
        ]
    ):
        row = BatchRow(f"batch_{n}", key_id, "/v1/chat/completions", "file-x", CREATED, CREATED)
        store.add_batch(row)
        row.status = status  # type: ignore[assignment]
        row.total, row.completed, row.failed = counts
        assert store.save_batch(row, "validating")
    store.close()
    return tmp_path / "keys.db", team_a.key_id, team_b.key_id


def test_every_keys_batches_newest_first_with_names(
    keys_db: tuple[Path, str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    path, team_a, team_b = keys_db
    code, out, _ = serving(capsys, "batches", "list", "--keys-db", str(path))
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == [
        "ID", "KEY", "NAME", "STATUS", "TOTAL", "DONE", "FAILED", "CREATED", "ENDPOINT"
    ]  # fmt: skip
    assert [line.split() for line in lines[1:]] == [
        ["batch_2", team_b, "team-b", "failed", "0", "0", "0", "2026-05-28", "20:26",
         "/v1/chat/completions"],
        ["batch_1", team_a, "team-a", "completed", "3", "3", "0", "2026-05-28", "20:26",
         "/v1/chat/completions"],
        ["batch_0", team_a, "team-a", "in_progress", "10", "4", "1", "2026-05-28", "20:26",
         "/v1/chat/completions"],
    ]  # fmt: skip


def test_filters_by_status_and_key(
    keys_db: tuple[Path, str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    path, team_a, _ = keys_db
    where = ("--keys-db", str(path))
    _, out, _ = serving(capsys, "batches", "list", "--status", "in_progress", *where)
    assert [line.split()[0] for line in out.splitlines()[1:]] == ["batch_0"]
    _, out, _ = serving(capsys, "batches", "list", "--key", team_a, *where)
    assert [line.split()[0] for line in out.splitlines()[1:]] == ["batch_1", "batch_0"]
    _, out, _ = serving(capsys, "batches", "list", "--status", "expired", *where)
    assert out == "no batches\n"


def test_json_is_openais_batch_objects_with_the_key_name(
    keys_db: tuple[Path, str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    path, team_a, _ = keys_db
    code, out, _ = serving(
        capsys, "batches", "list", "--json", "--key", team_a, "--keys-db", str(path)
    )
    found = json.loads(out)
    assert code == 0 and [batch["id"] for batch in found] == ["batch_1", "batch_0"]
    assert found[1]["object"] == "batch" and found[1]["status"] == "in_progress"
    assert found[1]["request_counts"] == {"total": 10, "completed": 4, "failed": 1}
    assert {batch["key_name"] for batch in found} == {"team-a"}


def test_a_batch_db_elsewhere_and_a_key_without_a_name(
    keys_db: tuple[Path, str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, _, _ = keys_db
    moved = tmp_path / "elsewhere.db"
    (path.parent / DB_NAME).rename(moved)
    missing_keys = tmp_path / "none" / "keys.db"
    code, out, _ = serving(
        capsys, "batches", "list", "--batch-db", str(moved), "--keys-db", str(missing_keys)
    )
    newest = out.splitlines()[1].split()
    assert code == 0 and newest[0] == "batch_2" and newest[2] == "-"  # no keys.db: no names


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--status", "running"], "--status: 'running' is not one of validating, in_progress,"),
        (["--batch-db", "/nonexistent/batches.db"], "--batch-db: /nonexistent/batches.db does not"),
    ],
)
def test_bad_input_is_one_line_naming_the_flag(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = serving(capsys, "batches", "list", *flags)
    assert (code, out) == (2, "")
    assert err.startswith(f"serving batches: error: {message}"), err
    assert err.count("\n") == 1
