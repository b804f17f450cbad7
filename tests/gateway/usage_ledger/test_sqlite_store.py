"""The ledger in keys.db: gateways sharing the file add up, a batch is applied once even when
its COMMIT reported an error after taking effect, and days past retention are pruned."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest

from serving.gateway.usage_ledger import sqlite_store
from serving.gateway.usage_ledger.days import DAY_S
from serving.gateway.usage_ledger.recorder import UsageRecorder
from serving.gateway.usage_ledger.sqlite_store import SqliteUsageStore, read_usage_file
from serving.gateway.usage_ledger.tally import UsageRow
from tests.gateway.quota.running import run_async
from tests.gateway.sqlite_faults import CommitThenFail, connect_commit_then_fail
from tests.gateway.usage_ledger.test_recorder import DEADLINE_S, NOW, Record

DAY = "2026-03-01"


@run_async
async def test_rows_round_trip_and_writers_sharing_the_file_add_up(path: Path) -> None:
    first = SqliteUsageStore(path, now=lambda: NOW)
    second = SqliteUsageStore(path, now=lambda: NOW)
    await first.write(
        "w1", 1, {(DAY, "key_a", "m1"): [3, 4, 0, 0], ("2026-03-02", "key_a", "m1"): [1, 1, 0, 0]}
    )
    await second.write(
        "w2", 1, {(DAY, "key_a", "m1"): [10, 20, 0, 0], (DAY, "key_b", "m|2"): [0, 5, 0, 0]}
    )
    await first.write("w1", 2, {(DAY, "key_a", "m1"): [100, 0, 0, 0]})
    assert await second.read(DAY, DAY, None) == [
        UsageRow(DAY, "key_a", "m1", 113, 24),
        UsageRow(DAY, "key_b", "m|2", 0, 5),
    ]
    assert read_usage_file(path, DAY, "2026-03-31", "key_a") == [
        UsageRow(DAY, "key_a", "m1", 113, 24),
        UsageRow("2026-03-02", "key_a", "m1", 1, 1),
    ]
    assert read_usage_file(path, "2026-04-01", "2026-04-30", None) == []
    await first.close()
    await second.close()


@run_async
async def test_a_batch_already_in_is_not_added_again(path: Path) -> None:
    store = SqliteUsageStore(path, now=lambda: NOW)
    await store.write("w1", 1, {(DAY, "key_a", "m1"): [3, 4, 0, 0]})
    await store.write("w1", 1, {(DAY, "key_a", "m1"): [3, 4, 0, 0]})  # a retry of the same batch
    await store.write("w1", 2, {(DAY, "key_a", "m1"): [1, 1, 0, 0]})
    assert await store.read(DAY, DAY, None) == [UsageRow(DAY, "key_a", "m1", 4, 5)]
    await store.close()


def test_reading_a_file_no_gateway_recorded_in(path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_usage_file(path, DAY, DAY, None)
    assert not path.exists()  # a read never creates the file
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE api_keys (key_id TEXT)")  # a key store, no usage yet
    assert read_usage_file(path, DAY, DAY, None) == []


@run_async
async def test_days_past_retention_are_pruned_on_the_first_write_of_a_day(path: Path) -> None:
    clock = [NOW]
    store = SqliteUsageStore(path, retention_days=400, now=lambda: clock[0])
    old = {
        ("2025-01-24", "key_a", "m1"): [9, 9, 0, 0],  # 401 days before 2026-03-01: never kept
        ("2025-01-25", "key_a", "m1"): [1, 1, 0, 0],
        ("2025-01-26", "key_a", "m1"): [2, 2, 0, 0],
    }
    await store.write("w1", 1, old)  # on 2026-03-01: 2025-01-25 is the oldest day kept
    assert [row.day for row in read_usage_file(path, "2025-01-01", DAY, None)] == [
        "2025-01-25",
        "2025-01-26",
    ]
    clock[0] = NOW + DAY_S  # 2026-03-02: now 2025-01-26 is
    await store.write("w1", 2, {("2026-03-02", "key_a", "m1"): [5, 5, 0, 0]})
    assert read_usage_file(path, "2025-01-01", "2026-12-31", None) == [
        UsageRow("2025-01-26", "key_a", "m1", 2, 2),
        UsageRow("2026-03-02", "key_a", "m1", 5, 5),
    ]
    await store.close()


@run_async
async def test_a_failed_transaction_is_rolled_back_and_its_retry_applies_once(path: Path) -> None:
    store = SqliteUsageStore(path, now=lambda: NOW)
    recorder = UsageRecorder(store, interval_s=0.01, now=lambda: NOW)
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        # Fails after the usage rows were added: the rollback must undo them.
        conn.execute(
            "CREATE TRIGGER refuse BEFORE INSERT ON usage_writers"
            " BEGIN SELECT RAISE(ABORT, 'disk says no'); END"
        )
    recorder.record(Record("key_a", "m1", 3, 4))
    assert not await recorder.flush(0.3)
    assert recorder.failures() >= 1
    assert read_usage_file(path, DAY, DAY, None) == []
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("DROP TRIGGER refuse")
    assert await recorder.flush(DEADLINE_S)
    assert read_usage_file(path, DAY, DAY, None) == [UsageRow(DAY, "key_a", "m1", 3, 4)]
    await recorder.close()


@run_async
async def test_a_commit_that_failed_after_taking_effect_is_not_applied_twice(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(CommitThenFail, "armed", False)  # not while creating the tables
    monkeypatch.setattr(sqlite_store, "connect_wal", connect_commit_then_fail)
    store = SqliteUsageStore(path, now=lambda: NOW)
    recorder = UsageRecorder(store, interval_s=0.01, now=lambda: NOW)
    monkeypatch.setattr(CommitThenFail, "armed", True)
    recorder.record(Record("key_a", "m1", 3, 4))
    assert await recorder.flush(DEADLINE_S)
    assert recorder.failures() == 1
    recorder.record(Record("key_a", "m1", 1, 1))
    await recorder.close()
    assert read_usage_file(path, DAY, DAY, None) == [UsageRow(DAY, "key_a", "m1", 4, 5)]


# `usage_days` as keys.db held it before Batch API tokens were told apart, and the write of a
# gateway that does not tell them apart: such a file and such a gateway must keep working.
OLD_TABLE = (
    "CREATE TABLE usage_days (day TEXT NOT NULL, key_id TEXT NOT NULL, model TEXT NOT NULL,"
    " prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL,"
    " PRIMARY KEY (day, key_id, model))"
)
OLD_ADD = (
    "INSERT INTO usage_days (day, key_id, model, prompt_tokens, completion_tokens)"
    " VALUES (?, ?, ?, ?, ?) ON CONFLICT (day, key_id, model) DO UPDATE SET"
    " prompt_tokens = usage_days.prompt_tokens + excluded.prompt_tokens,"
    " completion_tokens = usage_days.completion_tokens + excluded.completion_tokens"
)


def columns_of(path: Path) -> list[str]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return [row[1] for row in conn.execute("PRAGMA table_info(usage_days)")]


@run_async
async def test_batch_tokens_are_kept_apart_within_the_totals(path: Path) -> None:
    store = SqliteUsageStore(path, now=lambda: NOW)
    await store.write("w1", 1, {(DAY, "key_a", "m1"): [10, 20, 4, 5]})
    await store.write(
        "w1", 2, {(DAY, "key_a", "m1"): [1, 1, 1, 0], (DAY, "key_b", "m1"): [3, 3, 0, 0]}
    )
    assert await store.read(DAY, DAY, None) == [
        UsageRow(DAY, "key_a", "m1", 11, 21, 5, 5),
        UsageRow(DAY, "key_b", "m1", 3, 3, 0, 0),
    ]
    await store.close()


@run_async
async def test_a_keys_db_without_the_batch_columns_keeps_working(path: Path) -> None:
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute(OLD_TABLE)
        conn.execute(OLD_ADD, (DAY, "key_a", "m1", 7, 8))
    # `serving usage report` reads it as it is, and changes nothing.
    assert read_usage_file(path, DAY, DAY, None) == [UsageRow(DAY, "key_a", "m1", 7, 8, 0, 0)]
    assert "batch_prompt_tokens" not in columns_of(path)
    # A gateway's store adds the columns (two opening it at once add them once) and keeps
    # the rows; the batch part of what was there is none.
    first = SqliteUsageStore(path, now=lambda: NOW)
    second = SqliteUsageStore(path, now=lambda: NOW)
    assert columns_of(path)[-2:] == ["batch_prompt_tokens", "batch_completion_tokens"]
    await first.write("w1", 1, {(DAY, "key_a", "m1"): [3, 2, 3, 2]})
    # A gateway that does not tell batch tokens apart still adds its totals.
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute(OLD_ADD, (DAY, "key_a", "m1", 100, 100))
    assert await second.read(DAY, DAY, None) == [UsageRow(DAY, "key_a", "m1", 110, 110, 3, 2)]
    await first.close()
    await second.close()
