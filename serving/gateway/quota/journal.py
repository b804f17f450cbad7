"""Day and month budgets on disk: settled charges, added up by every process sharing the file
(docs/gateway.md, budgets on disk).

Rules:
- one row per (key, model, day|month, period); only settled charges are written, *added* to
  the rows of the period the lease was admitted in, so processes sharing keys.db sum up and
  a crash never over-charges;
- `record()` only queues; one writer thread commits what queued in one transaction, then
  rests `COMMIT_INTERVAL_S`: a SIGKILL loses at most an interval and a commit (WAL,
  synchronous=NORMAL: a power cut may lose the last commits);
- a failed transaction is rolled back, counted (`failures()`), logged and retried with the
  same deltas; its (writer, batch number) is stored so a COMMIT that reported an error but
  took effect is not applied twice;
- `close()` drains the queue until its deadline; `load()` reads the totals at start-up;
  minute windows are not persisted (they refill within a minute).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import sqlite3
import threading
import time
import uuid
from pathlib import Path
from typing import Literal, NamedTuple, Protocol

from serving.gateway.quota.limits import Scope
from serving.gateway.quota.sqlite_db import DEFAULT_BUSY_TIMEOUT_S, connect_wal

log = logging.getLogger(__name__)

BudgetKind = Literal["day", "month"]
# (key_id, model: '' for the key-wide scope, kind, period)
RowKey = tuple[str, str, BudgetKind, str]

DEFAULT_CLOSE_TIMEOUT_S = 10.0
# The writer's rest between commits: committing after every request would cost about a
# tenth of the gateway's per-request CPU (through the GIL).
COMMIT_INTERVAL_S = 0.05
RETRY_FIRST_S = 0.05
RETRY_MAX_S = 2.0
# Writer marks are only needed while their writer may still retry; a month is plenty.
WRITER_MARK_DAYS = 31


class Charge(NamedTuple):
    """Tokens a lease finally cost, booked in the day and month it was admitted in."""

    scopes: tuple[Scope, ...]
    day: str  # `2025-03-01`
    month: str  # `2025-03`
    tokens: int


class BudgetJournal(Protocol):
    def load(self, day: str, month: str) -> dict[tuple[Scope, BudgetKind], int]:
        """Spent amounts of the given day and month, by scope."""
        ...

    def record(self, charge: Charge) -> None:
        """Add a settled charge to the budgets on disk. Returns at once: never blocks on the
        disk and never raises, so it is safe on the request path."""
        ...


_SCHEMA = (
    """
    CREATE TABLE IF NOT EXISTS quota_budgets (
        key_id TEXT NOT NULL,
        model TEXT NOT NULL,  -- '' for the key-wide scope; model names are never empty
        kind TEXT NOT NULL CHECK (kind IN ('day', 'month')),
        period TEXT NOT NULL,
        spent INTEGER NOT NULL,
        PRIMARY KEY (key_id, model, kind, period)
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS quota_budget_writers (
        writer TEXT PRIMARY KEY,  -- one per journal instance (process start)
        batch INTEGER NOT NULL,  -- the last batch it committed
        written_on TEXT NOT NULL  -- UTC day, for pruning
    )
    """,
)
_ADD = (
    "INSERT INTO quota_budgets (key_id, model, kind, period, spent) VALUES (?, ?, ?, ?, ?)"
    " ON CONFLICT (key_id, model, kind, period)"
    " DO UPDATE SET spent = quota_budgets.spent + excluded.spent"
)
_MARK = (
    "INSERT INTO quota_budget_writers (writer, batch, written_on) VALUES (?, ?, ?)"
    " ON CONFLICT (writer) DO UPDATE SET batch = excluded.batch, written_on = excluded.written_on"
)


def _utc_day(days_ago: int = 0) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(time.time() - days_ago * 86_400))


class _Stop:
    """Queued by `close()`: write what came before, then end the writer."""


_STOP = _Stop()
_Item = Charge | threading.Event | _Stop


class SqliteBudgetJournal:
    """Usage: `journal = SqliteBudgetJournal(path)`; `InMemoryQuotaStore(journal=journal)`
    records charges; `journal.close()` at shutdown writes what is still queued."""

    def __init__(self, path: Path, *, busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._path = path
        self._busy_timeout_s = busy_timeout_s
        self._writer = uuid.uuid4().hex
        self._batches = 0
        self._failures = 0
        self._unwritten = 0  # budget rows given up on at close
        self._queue: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        self._closed = False
        self._stopping = threading.Event()
        self._deadline = float("inf")
        self._pruned = False
        self._conn: sqlite3.Connection | None = connect_wal(path, busy_timeout_s)
        for statement in _SCHEMA:
            self._conn.execute(statement)
        # From here on the connection belongs to the writer thread alone.
        self._thread = threading.Thread(target=self._run, name="quota-journal", daemon=True)
        self._thread.start()

    def load(self, day: str, month: str) -> dict[tuple[Scope, BudgetKind], int]:
        conn = connect_wal(self._path, self._busy_timeout_s)
        try:
            rows = conn.execute(
                "SELECT key_id, model, kind, spent FROM quota_budgets"
                " WHERE (kind = 'day' AND period = ?) OR (kind = 'month' AND period = ?)",
                (day, month),
            ).fetchall()
        finally:
            conn.close()
        loaded: dict[tuple[Scope, BudgetKind], int] = {}
        for key_id, model, kind, spent in rows:
            loaded[(Scope(key_id, model or None), kind)] = int(spent)
        return loaded

    def record(self, charge: Charge) -> None:
        if self._closed:
            log.warning("quota budgets: a charge of %d tokens arrived after close", charge.tokens)
            return
        if charge.tokens:
            self._queue.put(charge)

    def failures(self) -> int:
        """Transactions that failed so far (each was rolled back and retried)."""
        return self._failures

    def unwritten(self) -> int:
        """Budget rows `close()` gave up on (they are logged too); 0 when nothing was lost."""
        return self._unwritten

    def drain(self, timeout: float) -> bool:
        """Wait until everything recorded before this call is committed; False if that did
        not happen within `timeout` seconds. Blocks: not for the event loop."""
        if self._closed:
            return self._unwritten == 0
        written = threading.Event()
        self._queue.put(written)
        return written.wait(timeout) and self._unwritten == 0

    def close(self, timeout: float = DEFAULT_CLOSE_TIMEOUT_S) -> None:
        """Write what is queued (retrying failures for up to `timeout` seconds), then stop the
        writer; see `unwritten()` for what could not be written."""
        if self._closed:
            return
        self._closed = True
        self._deadline = time.monotonic() + timeout
        self._stopping.set()
        self._queue.put(_STOP)
        # A transaction started just before the deadline may wait out its busy timeout.
        self._thread.join(timeout + self._busy_timeout_s + 1.0)
        if self._thread.is_alive():
            log.error("quota budgets: the journal writer did not stop within %.0f s", timeout)
            return
        self._disconnect()

    # -- the writer thread ----------------------------------------------------------------

    def _run(self) -> None:
        stop = False
        while not stop:
            batch: dict[RowKey, int] = {}
            waiters: list[threading.Event] = []
            item = self._queue.get()
            while True:
                if isinstance(item, Charge):
                    _add(batch, item)
                elif isinstance(item, threading.Event):
                    waiters.append(item)
                else:
                    stop = True  # close() queues nothing after this
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            if batch and not self._write(batch):
                self._give_up(len(batch))
                stop = True
            for waiter in waiters:
                waiter.set()
            if batch and not stop:
                self._stopping.wait(COMMIT_INTERVAL_S)  # close() cuts the rest short

    def _write(self, batch: dict[RowKey, int]) -> bool:
        """Commit `batch`, retrying the same deltas until it is in; False only when closing
        and the deadline passed first."""
        self._batches += 1
        number = self._batches
        attempts = 0
        delay = RETRY_FIRST_S
        while True:
            try:
                self._commit(batch, number, check=attempts > 0)
            except Exception as exc:  # sqlite3.Error mostly; any failure must not end the writer
                self._disconnect()  # closing rolls back whatever the transaction left open
                attempts += 1
                self._failures += 1
                level = logging.WARNING if attempts == 1 else logging.DEBUG
                log.log(
                    level,
                    "quota budgets: could not write %d rows (attempt %d), retrying: %s",
                    len(batch), attempts, exc,
                )  # fmt: skip
                if self._stopping.is_set():
                    left = self._deadline - time.monotonic()
                    if left <= 0:
                        return False
                    time.sleep(min(delay, left))
                else:
                    self._stopping.wait(delay)
                delay = min(delay * 2, RETRY_MAX_S)
                continue
            if attempts:
                log.warning("quota budgets: written again after %d failed attempts", attempts)
            return True

    def _commit(self, batch: dict[RowKey, int], number: int, *, check: bool) -> None:
        if self._conn is None:
            self._conn = connect_wal(self._path, self._busy_timeout_s)
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        if check:
            # Did an earlier attempt commit after all (its COMMIT reported an error)?
            row = conn.execute(
                "SELECT batch FROM quota_budget_writers WHERE writer = ?", (self._writer,)
            ).fetchone()
            if row is not None and row[0] >= number:
                conn.execute("ROLLBACK")
                return
        conn.executemany(_ADD, [(*key, tokens) for key, tokens in batch.items()])
        conn.execute(_MARK, (self._writer, number, _utc_day()))
        if not self._pruned:  # marks of writers long gone, once per journal
            conn.execute(
                "DELETE FROM quota_budget_writers WHERE written_on < ?",
                (_utc_day(WRITER_MARK_DAYS),),
            )
        conn.execute("COMMIT")
        self._pruned = True

    def _disconnect(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            # Closing a connection whose file has gone bad can fail too; it is dropped anyway.
            with contextlib.suppress(sqlite3.Error):
                conn.close()

    def _give_up(self, rows: int) -> None:
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, Charge):
                rows += 2 * len(item.scopes)
            elif isinstance(item, threading.Event):
                item.set()  # `drain()` then reports the loss rather than hanging
        self._unwritten = rows
        log.error("quota budgets: %d budget rows of settled charges were not written", rows)
        self._disconnect()


def _add(batch: dict[RowKey, int], charge: Charge) -> None:
    for scope in charge.scopes:
        model = scope.model or ""
        day: RowKey = (scope.key_id, model, "day", charge.day)
        month: RowKey = (scope.key_id, model, "month", charge.month)
        batch[day] = batch.get(day, 0) + charge.tokens
        batch[month] = batch.get(month, 0) + charge.tokens
