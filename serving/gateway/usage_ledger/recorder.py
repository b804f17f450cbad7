"""`UsageRecorder`: every settled request's tokens, written to the deployment's ledger in the
background, in numbered batches that are applied exactly once (docs/usage-reports.md, where
it is kept; what a crash may lose).

    recorder = UsageRecorder(SqliteUsageStore(path, retention_days=400))
    recorder.record(record)      # on the event loop, where the request's metrics are observed
    recorder.record(record, batch=True)     # a Batch API line's (reported apart)
    await recorder.flush(5.0)    # everything recorded so far is written (False: not in time)
    rows = await recorder.read("2026-03-01", "2026-03-31", None)
    await recorder.close()       # at shutdown: writes what is left, then closes the store

Rules:
- `record` only adds to a tally; a writer task, started by the first record after a quiet
  spell and ended by a round with nothing to write, hands the tally to the store every
  `FLUSH_INTERVAL_S` as one numbered batch;
- the store applies a batch with a mark "this writer's batch N is in", atomically, unless
  the mark is there already; a failed write is retried with the same batch and number
  (back-off doubling up to `RETRY_MAX_S`), so it is never applied twice;
- `close` writes what is left, retrying until its deadline, and logs what it could not.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from typing import Protocol

from serving.gateway.usage_ledger.tally import Batch, Tally, UsageRow

log = logging.getLogger(__name__)

FLUSH_INTERVAL_S = 0.25
RETRY_FIRST_S = 0.1
RETRY_MAX_S = 5.0
CLOSE_TIMEOUT_S = 10.0


class TokenRecord(Protocol):
    """What is recorded of a request (`metrics.RequestRecord`): tokens as charged."""

    @property
    def key(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def prompt_tokens(self) -> int: ...
    @property
    def completion_tokens(self) -> int: ...


class LedgerStore(Protocol):
    """Where the ledger lives: `sqlite_store.SqliteUsageStore`, `redis_store.RedisUsageStore`."""

    async def write(self, writer: str, number: int, batch: Batch) -> None:
        """Add `batch` to the ledger unless `writer`'s batch `number` is in already. Raises
        when the write failed (it may have taken effect all the same)."""
        ...

    async def read(self, first: str, last: str, key_id: str | None) -> list[UsageRow]:
        """The rows of the days from `first` to `last` (of one key, or all)."""
        ...

    async def close(self) -> None: ...


class UsageRecorder:
    """See the module docstring. `record`, `flush` and `close` run on one event loop."""

    def __init__(
        self,
        store: LedgerStore,
        *,
        interval_s: float | None = None,
        now: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self._interval_s = FLUSH_INTERVAL_S if interval_s is None else interval_s
        self._tally = Tally(now)
        self._writer = uuid.uuid4().hex
        self._numbered = 0  # batches numbered so far
        self._written = 0  # the number of the last batch the store took
        self._unsent: Batch | None = None  # batch number `_numbered`, until the store takes it
        self._attempts = 0
        self._failures = 0
        self._task: asyncio.Task[None] | None = None
        self._hurry = asyncio.Event()
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._closed = False

    def record(self, record: TokenRecord, *, batch: bool = False) -> None:
        """Add a finished request's tokens (nothing for a request that was charged none);
        `batch` for a Batch API line's. Never blocks and never raises: it runs on every
        request."""
        prompt, completion = record.prompt_tokens, record.completion_tokens
        if not (prompt or completion):
            return
        if self._closed:
            log.warning("usage ledger: %d tokens arrived after close", prompt + completion)
            return
        self._tally.add(record.key, record.model, prompt, completion, batch=batch)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    def failures(self) -> int:
        """Writes that failed so far (each was retried)."""
        return self._failures

    def unwritten_rows(self) -> int:
        """Rows recorded and not written yet."""
        return len(self._tally) + len(self._unsent or ())

    async def flush(self, timeout: float) -> bool:
        """Wait until everything recorded before this call is written; False if that did not
        happen within `timeout` seconds (it is still written later)."""
        target = self._numbered + (1 if len(self._tally) else 0)
        if target <= self._written:
            return True
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append((target, waiter))
        self._hurry.set()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(waiter)
        except TimeoutError:
            with contextlib.suppress(ValueError):  # unless a write took it out meanwhile
                self._waiters.remove((target, waiter))
            return False
        return True

    async def read(self, first: str, last: str, key_id: str | None) -> list[UsageRow]:
        """What the ledger holds (written batches: `flush` first for this process's latest)."""
        return await self.store.read(first, last, key_id)

    async def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """Write what is left (retrying until `timeout`), then close the store."""
        if self._closed:
            return
        self._closed = True
        if not await self.flush(timeout):
            log.error("usage ledger: %d rows of usage were not written", self.unwritten_rows())
        task = self._task
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.store.close()

    # -- the writer task ----------------------------------------------------------------------

    async def _run(self) -> None:
        delay = self._interval_s
        try:
            while True:
                await self._pause(delay)
                if self._unsent is None:
                    batch = self._tally.take()
                    if not batch:
                        return  # no await before `finally`: a record now starts a new task
                    self._numbered += 1
                    self._unsent = batch
                delay = await self._write(self._unsent)
        finally:
            self._task = None

    async def _pause(self, delay: float) -> None:
        """Wait `delay` seconds, less if a flush is waiting."""
        if not self._hurry.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._hurry.wait()
        self._hurry.clear()

    async def _write(self, batch: Batch) -> float:
        """Hand the unsent batch to the store; the wait before the next round."""
        number = self._numbered
        try:
            await self.store.write(self._writer, number, batch)
        except Exception as exc:  # any failure must leave the batch to be retried
            self._failures += 1
            self._attempts += 1
            level = logging.WARNING if self._attempts == 1 else logging.DEBUG
            log.log(
                level,
                "usage ledger: could not write %d rows (attempt %d), retrying: %s",
                len(batch), self._attempts, exc,
            )  # fmt: skip
            return min(RETRY_FIRST_S * 2.0 ** (self._attempts - 1), RETRY_MAX_S)
        if self._attempts:
            log.warning("usage ledger: written again after %d failed attempts", self._attempts)
        self._attempts = 0
        self._unsent = None
        self._written = number
        waiters = self._waiters
        self._waiters = [(target, w) for target, w in waiters if target > number]
        for target, waiter in waiters:
            if target <= number and not waiter.done():
                waiter.set_result(None)
        return self._interval_s
