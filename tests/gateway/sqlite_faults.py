"""A SQLite connection whose COMMIT takes effect and still fails, once: the write-ahead stores'
tests (the budget journal, the usage ledger) check that such a commit is not applied twice."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any


class CommitThenFail(sqlite3.Connection):
    """A COMMIT that takes effect and still reports an error, once (as an I/O error late in
    a commit may); a test arms it with `monkeypatch.setattr(CommitThenFail, "armed", True)`."""

    armed = True

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        cursor = super().execute(sql, *args)
        if sql == "COMMIT" and CommitThenFail.armed:
            CommitThenFail.armed = False
            raise sqlite3.OperationalError("disk I/O error (injected after the commit)")
        return cursor


def connect_commit_then_fail(target: Path, busy_timeout_s: float) -> sqlite3.Connection:
    """`connect_wal`'s signature, on a `CommitThenFail` connection."""
    conn = sqlite3.connect(
        target, isolation_level=None, check_same_thread=False, factory=CommitThenFail
    )
    conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
    return conn
