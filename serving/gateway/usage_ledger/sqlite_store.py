"""The ledger in SQLite: table `usage_days` in keys.db, for gateways without Redis
(docs/usage-reports.md).

    store = SqliteUsageStore(Path("var/keys.db"), retention_days=400)
    await store.write(writer, number, batch)        # one transaction, in a worker thread
    rows = read_usage_file(path, "2026-03-01", "2026-03-31", None)   # `serving usage report`

Rules:
- one row per (UTC day, key id, model); a batch *adds* to the rows, so gateways sharing one
  keys.db each add what they recorded and the rows are their sum;
- `prompt_tokens`/`completion_tokens` are every request's, `batch_*` the Batch API lines'
  part of them; a table without the `batch_*` columns gets them (`ALTER TABLE ... DEFAULT 0`:
  its rows keep their totals, with no batch part) when a store opens it, and reads as if it
  had them;
- the same transaction stores the writer's batch number (`usage_writers`), so a batch already
  in is not added again; the first write of each UTC day deletes the days past retention and
  the marks of writers not seen for `WRITER_MARK_DAYS`;
- writes run in a worker thread, never on the event loop (a commit waits for the disk and
  the busy timeout); WAL with synchronous=NORMAL, as for the keys and the budget journal.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

from serving.gateway.quota.sqlite_db import DEFAULT_BUSY_TIMEOUT_S, connect, connect_wal
from serving.gateway.usage_ledger.days import DEFAULT_RETENTION_DAYS, oldest_kept, utc_day
from serving.gateway.usage_ledger.tally import Batch, UsageRow

# A writer's mark is needed only while it may still retry; a month is plenty.
WRITER_MARK_DAYS = 31

_SCHEMA = (
    """
    CREATE TABLE IF NOT EXISTS usage_days (
        day TEXT NOT NULL,  -- UTC, 2026-03-01
        key_id TEXT NOT NULL,
        model TEXT NOT NULL,  -- the model or adapter as the gateway's metrics label it
        prompt_tokens INTEGER NOT NULL,  -- every request's: interactive and Batch API lines
        completion_tokens INTEGER NOT NULL,
        batch_prompt_tokens INTEGER NOT NULL DEFAULT 0,  -- the Batch API lines' part
        batch_completion_tokens INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (day, key_id, model)
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS usage_writers (
        writer TEXT PRIMARY KEY,  -- one per recorder (gateway process)
        batch INTEGER NOT NULL,  -- the last batch it wrote
        written_on TEXT NOT NULL  -- UTC day, for pruning
    )
    """,
)
# The Batch API lines' part of a row: columns an older keys.db's `usage_days` lacks.
BATCH_COLUMNS = ("batch_prompt_tokens", "batch_completion_tokens")
_ADD = (
    "INSERT INTO usage_days (day, key_id, model, prompt_tokens, completion_tokens,"
    " batch_prompt_tokens, batch_completion_tokens) VALUES (?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (day, key_id, model) DO UPDATE SET"
    " prompt_tokens = usage_days.prompt_tokens + excluded.prompt_tokens,"
    " completion_tokens = usage_days.completion_tokens + excluded.completion_tokens,"
    " batch_prompt_tokens = usage_days.batch_prompt_tokens + excluded.batch_prompt_tokens,"
    " batch_completion_tokens ="
    " usage_days.batch_completion_tokens + excluded.batch_completion_tokens"
)
_MARK = (
    "INSERT INTO usage_writers (writer, batch, written_on) VALUES (?, ?, ?)"
    " ON CONFLICT (writer) DO UPDATE SET batch = excluded.batch, written_on = excluded.written_on"
)


def _columns(conn: sqlite3.Connection) -> set[str]:
    """The columns of `usage_days`; none when there is no such table."""
    return {row[1] for row in conn.execute("PRAGMA table_info(usage_days)")}


def _add_batch_columns(conn: sqlite3.Connection) -> None:
    """Give a `usage_days` without them the `batch_*` columns, in one transaction, so that
    gateways opening the file at once add them once."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        missing = [name for name in BATCH_COLUMNS if name not in _columns(conn)]
        for name in missing:
            conn.execute(f"ALTER TABLE usage_days ADD COLUMN {name} INTEGER NOT NULL DEFAULT 0")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def read_usage_file(
    path: Path,
    first: str,
    last: str,
    key_id: str | None,
    *,
    busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S,
) -> list[UsageRow]:
    """The rows of the days from `first` to `last` (of one key, or all) in keys.db; none
    when no gateway recorded any there yet. `FileNotFoundError` when there is no such file
    (checked first: connecting would create one)."""
    if not path.is_file():
        raise FileNotFoundError(str(path))
    args = [first, last]
    with contextlib.closing(connect(path, busy_timeout_s)) as conn:
        columns = _columns(conn)
        if not columns:
            return []
        # A file no gateway has opened since it was made without the batch columns: its
        # rows have no batch part. Read as it is: a report never writes.
        batch = ", ".join(name if name in columns else "0" for name in BATCH_COLUMNS)
        sql = (
            f"SELECT day, key_id, model, prompt_tokens, completion_tokens, {batch}"
            " FROM usage_days WHERE day BETWEEN ? AND ?"
        )
        if key_id is not None:
            sql += " AND key_id = ?"
            args.append(key_id)
        found = conn.execute(sql + " ORDER BY day, key_id, model", args).fetchall()
    return [UsageRow(*row) for row in found]


class SqliteUsageStore:
    """A `recorder.LedgerStore` over one SQLite file; creates its tables if missing."""

    def __init__(
        self,
        path: Path,
        *,
        retention_days: int = DEFAULT_RETENTION_DAYS,
        busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S,
        now: Callable[[], float] = time.time,
    ) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._retention_days = retention_days
        self._busy_timeout_s = busy_timeout_s
        self._now = now
        self._pruned_on = ""
        # One write at a time, and never a close in the middle of one (a write the recorder
        # gave up waiting for still runs in its thread).
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = connect_wal(path, busy_timeout_s)
        for statement in _SCHEMA:
            self._conn.execute(statement)
        if not _columns(self._conn).issuperset(BATCH_COLUMNS):
            _add_batch_columns(self._conn)

    async def write(self, writer: str, number: int, batch: Batch) -> None:
        await asyncio.to_thread(self._commit, writer, number, batch)

    async def read(self, first: str, last: str, key_id: str | None) -> list[UsageRow]:
        return await asyncio.to_thread(
            read_usage_file, self.path, first, last, key_id, busy_timeout_s=self._busy_timeout_s
        )

    async def close(self) -> None:
        await asyncio.to_thread(self._disconnect)

    def _commit(self, writer: str, number: int, batch: Batch) -> None:
        with self._lock:
            if self._conn is None:
                self._conn = connect_wal(self.path, self._busy_timeout_s)
            conn = self._conn
            today = utc_day(self._now())
            try:
                conn.execute("BEGIN IMMEDIATE")
                mark = conn.execute(
                    "SELECT batch FROM usage_writers WHERE writer = ?", (writer,)
                ).fetchone()
                if mark is not None and mark[0] >= number:  # in already: its answer was lost
                    conn.execute("ROLLBACK")
                    return
                conn.executemany(_ADD, [(*row, *counts) for row, counts in batch.items()])
                conn.execute(_MARK, (writer, number, today))
                if today != self._pruned_on:
                    kept = oldest_kept(today, self._retention_days)
                    conn.execute("DELETE FROM usage_days WHERE day < ?", (kept,))
                    marks_kept = oldest_kept(today, WRITER_MARK_DAYS)
                    conn.execute("DELETE FROM usage_writers WHERE written_on < ?", (marks_kept,))
                conn.execute("COMMIT")
            except BaseException:
                self._close_connection()  # closing rolls back what the transaction left open
                raise
            self._pruned_on = today

    def _disconnect(self) -> None:
        with self._lock:
            self._close_connection()

    def _close_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            # Closing a connection whose file has gone bad can fail too; it is dropped anyway.
            with contextlib.suppress(sqlite3.Error):
                conn.close()
