"""The Batch API's state in one SQLite file (beside keys.db): each key's files, its
batches, every line run sent (its attempt) and every finished line's result, written as the
line finishes so a restarted gateway runs only the lines still missing.

    store = BatchStore(Path("var/batches.db"))
    store.add_file(row); store.get_file(key_id, file_id)   # None for another key's id
    store.start_attempt(attempt)                            # before the line is sent
    store.add_result(batch_id, line, custom_id, ok=True, text=output_line, attempt=rid)

Rules: every read of a file or batch names its owner's key id, so another key's id is
answered exactly as a missing one; lists are newest first by insertion order; calls are
serialised by one lock (the gateway calls them from the event loop and worker threads); a
result and the end of its attempt are one transaction, so an attempt still running when a
gateway starts is a run a dead gateway cut (`running_attempts`).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from serving.gateway.batches.attempts import Attempt
from serving.gateway.batches.objects import TIMESTAMPS, BatchRow, FileRow
from serving.gateway.quota.sqlite_db import connect_wal

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS batch_files (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    key_id TEXT NOT NULL,
    filename TEXT NOT NULL,
    purpose TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER
)""",
    """CREATE TABLE IF NOT EXISTS batches (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    key_id TEXT NOT NULL,
    status TEXT NOT NULL,
    state TEXT NOT NULL  -- JSON: the rest of the BatchRow
)""",
    """CREATE TABLE IF NOT EXISTS batch_results (
    batch_id TEXT NOT NULL,
    line INTEGER NOT NULL,
    custom_id TEXT NOT NULL,
    ok INTEGER NOT NULL,
    text TEXT NOT NULL,
    PRIMARY KEY (batch_id, line)
)""",
    """CREATE TABLE IF NOT EXISTS batch_attempts (
    request_id TEXT PRIMARY KEY,
    batch_id TEXT NOT NULL,
    line INTEGER NOT NULL,
    key_id TEXT NOT NULL,
    model TEXT NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    cut INTEGER NOT NULL DEFAULT 0  -- 1: cut by a dead gateway, its reservation charged
)""",
    "CREATE INDEX IF NOT EXISTS batches_by_status ON batches (status)",
    "CREATE INDEX IF NOT EXISTS batch_attempts_by_cut ON batch_attempts (cut, batch_id)",
)
_ATTEMPT_COLUMNS = "batch_id, line, request_id, key_id, model, prompt_tokens, completion_tokens"
DB_NAME = "batches.db"
"""Its name beside keys.db, where the gateway and `serving batches list` look by default."""
_FILE_COLUMNS = "id, key_id, filename, purpose, bytes, created_at, expires_at"
_ENDED = "('completed', 'failed', 'expired', 'cancelled')"


class BatchStore:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = connect_wal(path)
        self._lock = threading.Lock()
        with self._lock:
            for statement in _SCHEMA:
                self._conn.execute(statement)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    # files

    def add_file(self, row: FileRow) -> None:
        with self._lock:
            self._conn.execute(
                f"INSERT INTO batch_files ({_FILE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (row.id, row.key_id, row.filename, row.purpose, row.bytes, row.created_at,
                 row.expires_at),
            )  # fmt: skip

    def get_file(self, key_id: str, file_id: str) -> FileRow | None:
        with self._lock:
            found = self._conn.execute(
                f"SELECT {_FILE_COLUMNS} FROM batch_files WHERE id = ? AND key_id = ?",
                (file_id, key_id),
            ).fetchone()
        return None if found is None else FileRow(*found)

    def list_files(
        self, key_id: str, *, limit: int, after: str | None, ascending: bool, purpose: str | None
    ) -> list[FileRow]:
        """Up to `limit` of the key's files after the file `after` in the order asked for."""
        where, params = self._page("batch_files", key_id, after, ascending)
        if purpose is not None:
            where += " AND purpose = ?"
            params.append(purpose)
        order = "ASC" if ascending else "DESC"
        with self._lock:
            rows = self._conn.execute(
                f"SELECT {_FILE_COLUMNS} FROM batch_files WHERE {where} ORDER BY seq {order} "
                "LIMIT ?",
                (*params, limit),
            ).fetchall()
        return [FileRow(*row) for row in rows]

    def delete_file(self, key_id: str, file_id: str) -> bool:
        with self._lock:
            cursor = self._conn.execute(
                "DELETE FROM batch_files WHERE id = ? AND key_id = ?", (file_id, key_id)
            )
        return cursor.rowcount > 0

    def expired_files(self, now: int) -> list[FileRow]:
        with self._lock:
            rows = self._conn.execute(
                f"SELECT {_FILE_COLUMNS} FROM batch_files WHERE expires_at <= ?", (now,)
            ).fetchall()
        return [FileRow(*row) for row in rows]

    # batches

    def add_batch(self, row: BatchRow) -> None:
        with self._lock:
            self._conn.execute(
                "INSERT INTO batches (id, key_id, status, state) VALUES (?, ?, ?, ?)",
                (row.id, row.key_id, row.status, _state(row)),
            )

    def save_batch(self, row: BatchRow, expected: str) -> bool:
        """Write `row` if the batch's status is still `expected` (else another writer, the
        API's cancel, changed it first: False, nothing written)."""
        with self._lock:
            cursor = self._conn.execute(
                "UPDATE batches SET status = ?, state = ? WHERE id = ? AND status = ?",
                (row.status, _state(row), row.id, expected),
            )
        return cursor.rowcount > 0

    def batch_status(self, batch_id: str) -> str | None:
        with self._lock:
            found = self._conn.execute(
                "SELECT status FROM batches WHERE id = ?", (batch_id,)
            ).fetchone()
        return None if found is None else str(found[0])

    def get_batch(self, key_id: str, batch_id: str) -> BatchRow | None:
        with self._lock:
            found = self._conn.execute(
                "SELECT id, key_id, status, state FROM batches WHERE id = ? AND key_id = ?",
                (batch_id, key_id),
            ).fetchone()
        return None if found is None else _batch(found)

    def list_batches(self, key_id: str, *, limit: int, after: str | None) -> list[BatchRow]:
        where, params = self._page("batches", key_id, after, ascending=False)
        with self._lock:
            rows = self._conn.execute(
                f"SELECT id, key_id, status, state FROM batches WHERE {where} "
                "ORDER BY seq DESC LIMIT ?",
                (*params, limit),
            ).fetchall()
        return [_batch(row) for row in rows]

    def every_batch(self, *, status: str | None, key_id: str | None) -> list[BatchRow]:
        """Every key's batches, newest first, of one status or key if asked (operators')."""
        asked = {"status": status, "key_id": key_id}
        params = [value for value in asked.values() if value is not None]
        where = " AND ".join(f"{name} = ?" for name, value in asked.items() if value is not None)
        with self._lock:
            rows = self._conn.execute(
                f"SELECT id, key_id, status, state FROM batches WHERE {where or '1 = 1'} "
                "ORDER BY seq DESC",
                params,
            ).fetchall()
        return [_batch(row) for row in rows]

    def unfinished_batches(self) -> list[BatchRow]:
        """Every batch not ended yet, oldest first (the runner's work)."""
        with self._lock:
            rows = self._conn.execute(
                f"SELECT id, key_id, status, state FROM batches WHERE status NOT IN {_ENDED} "
                "ORDER BY seq"
            ).fetchall()
        return [_batch(row) for row in rows]

    def status_counts(self) -> dict[str, int]:
        """How many batches of every key are in each status (the metrics' gauge)."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT status, COUNT(*) FROM batches GROUP BY status"
            ).fetchall()
        return {str(status): int(count) for status, count in rows}

    def lines_waiting(self) -> int:
        """Lines of the batches in progress without a result yet (running ones included)."""
        with self._lock:
            total, done = self._conn.execute(
                "SELECT (SELECT COALESCE(SUM(json_extract(state, '$.counts[0]')), 0) FROM batches"
                " WHERE status = 'in_progress'), (SELECT COUNT(*) FROM batch_results WHERE"
                " batch_id IN (SELECT id FROM batches WHERE status = 'in_progress'))"
            ).fetchone()
        return int(total) - int(done)

    # results

    def add_result(
        self,
        batch_id: str,
        line: int,
        custom_id: str,
        *,
        ok: bool,
        text: str,
        attempt: str | None = None,
    ) -> None:
        """A finished line's output (or error) line, and the end of its run `attempt` (a
        request id), in one transaction; the first result recorded stays."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                self._conn.execute(
                    "INSERT OR IGNORE INTO batch_results VALUES (?, ?, ?, ?, ?)",
                    (batch_id, line, custom_id, int(ok), text),
                )
                if attempt is not None:
                    self._conn.execute(
                        "DELETE FROM batch_attempts WHERE request_id = ?", (attempt,)
                    )
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    # attempts

    def start_attempt(self, attempt: Attempt) -> None:
        """A line's run about to be sent (committed before it is)."""
        with self._lock:
            self._conn.execute(
                f"INSERT INTO batch_attempts ({_ATTEMPT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (attempt.batch_id, attempt.line, attempt.request_id, attempt.key_id,
                 attempt.model, attempt.prompt_tokens, attempt.completion_tokens),
            )  # fmt: skip

    def drop_attempt(self, request_id: str) -> None:
        """A run that ends without a result: refused for now, or charged as it ended."""
        with self._lock:
            self._conn.execute(
                "DELETE FROM batch_attempts WHERE request_id = ? AND cut = 0", (request_id,)
            )

    def running_attempts(self) -> list[Attempt]:
        """Runs sent and not ended, oldest first: at a gateway's start, the ones cut."""
        return self._attempts(0, None)

    def cut_attempts(self, batch_id: str | None = None) -> list[Attempt]:
        """Runs found cut and charged their reservation (of one batch, or every one)."""
        return self._attempts(1, batch_id)

    def mark_cut(self, request_id: str) -> None:
        """The cut run was charged: kept as a record, never charged again."""
        with self._lock:
            self._conn.execute(
                "UPDATE batch_attempts SET cut = 1 WHERE request_id = ?", (request_id,)
            )

    def _attempts(self, cut: int, batch_id: str | None) -> list[Attempt]:
        where, params = "cut = ?", list[Any]([cut])
        if batch_id is not None:
            where += " AND batch_id = ?"
            params.append(batch_id)
        with self._lock:
            rows = self._conn.execute(
                f"SELECT {_ATTEMPT_COLUMNS} FROM batch_attempts WHERE {where} ORDER BY rowid",
                params,
            ).fetchall()
        return [Attempt(*row) for row in rows]

    def done_lines(self, batch_id: str) -> set[int]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT line FROM batch_results WHERE batch_id = ?", (batch_id,)
            ).fetchall()
        return {line for (line,) in rows}

    def result_counts(self, batch_id: str) -> tuple[int, int]:
        """Lines finished with a 2xx, and with anything else."""
        with self._lock:
            ok, total = self._conn.execute(
                "SELECT COALESCE(SUM(ok), 0), COUNT(*) FROM batch_results WHERE batch_id = ?",
                (batch_id,),
            ).fetchone()
        return int(ok), int(total) - int(ok)

    def results(self, batch_id: str) -> list[tuple[int, bool, str]]:
        """(line, ok, text) of each finished line, in input order."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT line, ok, text FROM batch_results WHERE batch_id = ? ORDER BY line",
                (batch_id,),
            ).fetchall()
        return [(line, bool(ok), text) for line, ok, text in rows]

    def _page(
        self, table: str, key_id: str, after: str | None, ascending: bool
    ) -> tuple[str, list[Any]]:
        where, params = "key_id = ?", [key_id]
        if after is not None:
            where += f" AND seq {'>' if ascending else '<'} "
            where += f"COALESCE((SELECT seq FROM {table} WHERE id = ? AND key_id = ?), -1)"
            params += [after, key_id]
        return where, params


def _state(row: BatchRow) -> str:
    return json.dumps(
        {
            "endpoint": row.endpoint,
            "input_file_id": row.input_file_id,
            "created_at": row.created_at,
            "expires_at": row.expires_at,
            "metadata": row.metadata,
            "times": row.times,
            "counts": [row.total, row.completed, row.failed],
            "output_file_id": row.output_file_id,
            "error_file_id": row.error_file_id,
            "errors": row.errors,
        }
    )


def _batch(found: tuple[str, str, Any, str]) -> BatchRow:
    batch_id, key_id, status, text = found
    state = json.loads(text)
    total, completed, failed = state["counts"]
    times = {name: value for name, value in state["times"].items() if name in TIMESTAMPS}
    return BatchRow(
        batch_id, key_id, state["endpoint"], state["input_file_id"], state["created_at"],
        state["expires_at"], status, state["metadata"], times, total, completed, failed,
        state["output_file_id"], state["error_file_id"], state["errors"],
    )  # fmt: skip
