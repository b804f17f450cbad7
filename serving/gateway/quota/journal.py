"""Day and month budgets on disk, so restarting the single-process gateway loses nothing.

Only calendar budgets are persisted: minute windows refill within a minute of a restart
anyway. Rows are the whole spent amount of a (key, model, day|month, period), in-flight
reservations included, so a crash can over-charge (never under-charge) the requests that
were running. The table lives in the same SQLite file as the keys by default.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Literal, NamedTuple, Protocol

from serving.gateway.quota.limits import Scope

log = logging.getLogger(__name__)

BudgetKind = Literal["day", "month"]


class BudgetRow(NamedTuple):
    scope: Scope
    kind: BudgetKind
    period: str  # `2025-03-01` or `2025-03`
    spent: int


class BudgetJournal(Protocol):
    def load(self, day: str, month: str) -> dict[tuple[Scope, BudgetKind], int]:
        """Spent amounts of the given day and month, by scope."""
        ...

    def save(self, rows: Sequence[BudgetRow]) -> bool:
        """Write rows; False (never an exception) if the disk refused, so a request that
        happens to trigger a flush does not fail because of it."""
        ...


_SCHEMA = """
CREATE TABLE IF NOT EXISTS quota_budgets (
    key_id TEXT NOT NULL,
    model TEXT NOT NULL,  -- '' for the key-wide scope; model names are never empty
    kind TEXT NOT NULL CHECK (kind IN ('day', 'month')),
    period TEXT NOT NULL,
    spent INTEGER NOT NULL,
    PRIMARY KEY (key_id, model, kind, period)
)
"""


class SqliteBudgetJournal:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Autocommit mode with explicit BEGIN; the lock makes a flush from a worker thread safe.
        self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._lock = threading.Lock()
        with self._lock:
            self._conn.execute("PRAGMA busy_timeout = 5000")
            self._conn.execute("PRAGMA journal_mode = WAL")
            self._conn.execute("PRAGMA synchronous = NORMAL")
            self._conn.execute(_SCHEMA)

    def load(self, day: str, month: str) -> dict[tuple[Scope, BudgetKind], int]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT key_id, model, kind, spent FROM quota_budgets"
                " WHERE (kind = 'day' AND period = ?) OR (kind = 'month' AND period = ?)",
                (day, month),
            ).fetchall()
        loaded: dict[tuple[Scope, BudgetKind], int] = {}
        for key_id, model, kind, spent in rows:
            loaded[(Scope(key_id, model or None), kind)] = int(spent)
        return loaded

    def save(self, rows: Sequence[BudgetRow]) -> bool:
        values = [
            (row.scope.key_id, row.scope.model or "", row.kind, row.period, row.spent)
            for row in rows
        ]
        try:
            with self._lock:
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    self._conn.executemany(
                        "INSERT INTO quota_budgets (key_id, model, kind, period, spent)"
                        " VALUES (?, ?, ?, ?, ?)"
                        " ON CONFLICT (key_id, model, kind, period)"
                        " DO UPDATE SET spent = excluded.spent",
                        values,
                    )
                except BaseException:
                    self._conn.execute("ROLLBACK")
                    raise
                self._conn.execute("COMMIT")
        except sqlite3.Error as exc:
            log.warning("could not persist quota budgets (%d rows): %s", len(values), exc)
            return False
        return True

    def close(self) -> None:
        with self._lock:
            self._conn.close()
