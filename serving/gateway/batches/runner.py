"""The background job that moves batches along: validates new ones, runs their lines (at
most `concurrency` of a batch at once, each through `line_call`), and writes the output
and error files when a batch ends (completed, cancelled, expired).

    runner = BatchRunner(store, contents, owners, execute=..., reserve=..., charge_cut=...,
                         concurrency=4)
    runner.start(); runner.wake(); await runner.stop()    # the gateway's lifespan

Rules:
- a line's run is kept as an attempt (`BatchStore.start_attempt`, with its reservation)
  before it is sent; `execute` returns once the run's charge is written, and its output line
  is then recorded with the attempt's end in one transaction (`BatchStore.add_result`);
- a batch resumed after a restart runs only the lines without a result: a line running
  when the gateway died runs again (at least once), and its cut run is charged its
  reservation once (`charge_cut`) in the first round, before any line starts;
- a line refused for now (429, 503) waits its Retry-After and tries again until the
  batch's `expires_at`; any other answer is its result (4xx and 5xx: the error file);
- cancelling or expiry starts no new line; running ones finish, then the files are written
  from what was done (expiry adds a `batch_expired` error line for each line not run);
- status changes are conditional on the status read (`save_batch(row, expected)`), so a
  cancel from the API is never overwritten.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from serving.gateway.auth import Caller
from serving.gateway.batches.attempts import Attempt
from serving.gateway.batches.contents import FileContents
from serving.gateway.batches.line_call import LineResult
from serving.gateway.batches.metrics import LineOutcome
from serving.gateway.batches.objects import (
    FILE_TTL_S,
    OUTPUT_PURPOSE,
    BatchRow,
    BatchStatus,
    FileRow,
    dumps,
    new_id,
)
from serving.gateway.batches.owners import Owners
from serving.gateway.batches.store import BatchStore
from serving.gateway.batches.validation import ENDPOINTS, BatchLine, BodyCheck, error, validate
from serving.gateway.errors import UpstreamError
from serving.gateway.forwarded_headers import request_id
from serving.gateway.request_fields import Kind

logger = logging.getLogger(__name__)

Execute = Callable[[Kind, Caller, bytes, str, str], Awaitable[LineResult]]
"""Runs a line (kind, caller, body, endpoint, request id); returns once its charge is written."""
Reserve = Callable[[Kind, Caller, bytes], tuple[str, int, int]]
"""A line's reservation: (model label, prompt part, completion part) (`line_reservation`)."""
ChargeCut = Callable[[Attempt], Awaitable[None]]
"""Charges a cut run's reservation to its key; returns once the charge is written."""
CheckFor = Callable[[Caller], BodyCheck]
POLL_S = 0.5
PURGE_EVERY_S = 60.0


@dataclass
class _Work:
    """A running batch's lines in memory (from its input file), which of them have a result
    and which are still to start, and its line tasks: a round starts lines from `todo`
    without reading every line or every result again (a batch holds up to 50,000)."""

    lines: list[BatchLine]
    done: set[int]
    """Line numbers with a result recorded."""
    completed: int = 0
    failed: int = 0
    todo: deque[int] = field(default_factory=deque)
    """Indexes into `lines` of the lines not started, in file order."""
    running: dict[int, asyncio.Task[None]] = field(default_factory=dict)
    retrying: set[int] = field(default_factory=set)
    """Lines waiting to try again: nothing of theirs runs, so an ending batch cuts them."""

    @classmethod
    def of(cls, lines: list[BatchLine], done: set[int], counts: tuple[int, int]) -> _Work:
        todo = deque(index for index, line in enumerate(lines) if line.line not in done)
        return cls(lines, done, *counts, todo=todo)


class BatchRunner:
    def __init__(
        self,
        store: BatchStore,
        contents: FileContents,
        owners: Owners,
        *,
        execute: Execute,
        reserve: Reserve,
        charge_cut: ChargeCut,
        check_for: CheckFor,
        concurrency: int,
        max_lines: int,
        clock: Callable[[], float] = time.time,
        poll_s: float = POLL_S,
        count_line: Callable[[LineOutcome], None] = lambda outcome: None,
    ) -> None:
        self._store = store
        self._contents = contents
        self._owners = owners
        self._execute = execute
        self._reserve = reserve
        self._charge_cut = charge_cut
        self._cuts_charged = False
        self._check_for = check_for
        self._concurrency = concurrency
        self._max_lines = max_lines
        self._clock = clock
        self._poll_s = poll_s
        self._count_line = count_line
        self._work: dict[str, _Work] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._purged_at = 0.0

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="batch runner")

    async def stop(self) -> None:
        """Stop starting lines and cut the running ones (they run again after a restart)."""
        tasks = [task for work in self._work.values() for task in work.running.values()]
        if self._task is not None:
            tasks.append(self._task)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._work.clear()

    def wake(self) -> None:
        """Look at the batches now (one was created, cancelled, or a line ended)."""
        self._wake.set()

    async def _loop(self) -> None:
        while True:
            try:
                await self.run_once()
            except Exception:
                logger.exception("batch runner round failed; retrying")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._poll_s)
            self._wake.clear()

    async def run_once(self) -> None:
        """One round: every unfinished batch advanced as far as it can go now (the first
        round charges the runs a dead gateway cut first)."""
        if not self._cuts_charged:
            await self._charge_cuts()
        now = self._clock()
        for row in self._store.unfinished_batches():
            await self._advance(row, now)
        if now - self._purged_at >= PURGE_EVERY_S:
            self._purged_at = now
            for expired in self._store.expired_files(int(now)):
                self._store.delete_file(expired.key_id, expired.id)
                self._contents.delete(expired.id)

    async def _charge_cuts(self) -> None:
        """Each attempt a dead gateway left running: its reservation charged once (marked
        only after the charge is written: a kill in between charges it again, never not)."""
        cut = self._store.running_attempts()
        for attempt in cut:
            await self._charge_cut(attempt)
            self._store.mark_cut(attempt.request_id)
        if cut:
            tokens = sum(attempt.prompt_tokens + attempt.completion_tokens for attempt in cut)
            logger.warning(
                "batch lines: %d runs cut by a restart charged %d tokens", len(cut), tokens
            )
        self._cuts_charged = True

    def running(self, batch_id: str) -> int:
        work = self._work.get(batch_id)
        return len(work.running) if work else 0

    async def _advance(self, row: BatchRow, now: float) -> None:
        status = row.status
        if status == "finalizing":  # a restart while its files were written
            await self._finish(row, _final_of(row), now)
            return
        caller = self._owners.lookup(row.key_id)
        if caller is None:
            row.errors = [error("invalid_api_key", "The batch's key was revoked.")]
            await self._end_when_idle(row, "failed", now)
            return
        if status == "validating":
            await self._validate(row, caller, now)
        elif status == "in_progress":
            if now >= row.expires_at:
                await self._end_when_idle(row, "expired", now)
            else:
                await self._start_lines(row, caller)
        elif status == "cancelling":
            await self._end_when_idle(row, "cancelled", now)

    async def _validate(self, row: BatchRow, caller: Caller, now: float) -> None:
        # Off the event loop: a large file's checks take a while.
        lines, errors = await asyncio.to_thread(self._read_lines, row, self._check_for(caller))
        if lines is None:
            return  # the engines' model list is not known yet: next round
        if errors:
            row.errors = errors
            row.status, row.times["failed_at"] = "failed", int(now)
        else:
            self._work[row.id] = _Work.of(lines, set(), (0, 0))
            row.total, row.status = len(lines), "in_progress"
            row.times["in_progress_at"] = int(now)
        self._store.save_batch(row, "validating")

    def _read_lines(
        self, row: BatchRow, check: BodyCheck
    ) -> tuple[list[BatchLine] | None, list[dict[str, Any]]]:
        path = self._contents.path(row.input_file_id)
        if self._store.get_file(row.key_id, row.input_file_id) is None or not path.exists():
            return [], [error("file_not_found", "The input file was deleted.")]
        try:
            with open(path, "rb") as data:
                return validate(data, endpoint=row.endpoint, check=check, max_lines=self._max_lines)
        except UpstreamError:
            return None, []

    async def _start_lines(self, row: BatchRow, caller: Caller) -> None:
        work = self._work.get(row.id)
        if work is None:  # resumed after a restart: the file was validated before
            lines, _ = await asyncio.to_thread(self._read_lines, row, lambda kind, body: None)
            done, counts = self._store.done_lines(row.id), self._store.result_counts(row.id)
            work = self._work[row.id] = _Work.of(lines or [], done, counts)
        if (work.completed, work.failed) != (row.completed, row.failed):
            row.completed, row.failed = work.completed, work.failed
            self._store.save_batch(row, "in_progress")
        kind = ENDPOINTS[row.endpoint]
        while work.todo and len(work.running) < self._concurrency:
            index = work.todo.popleft()
            line = work.lines[index]
            task = asyncio.create_task(self._run_line(row, kind, caller, line))
            work.running[line.line] = task
            task.add_done_callback(functools.partial(self._line_ended, row.id, line.line, index))
        if not work.running and len(work.done) >= len(work.lines):  # every line has its result
            row.status = "finalizing"
            row.times["finalizing_at"] = int(self._clock())
            if self._store.save_batch(row, "in_progress"):
                self.wake()

    def _line_ended(self, batch_id: str, line: int, index: int, task: asyncio.Task[None]) -> None:
        """A line's task ended: with its result, not run (the batch ends without it), cut
        (the runner stops) or failed, which starts it again in the next round."""
        work = self._work.get(batch_id)
        if work is not None:
            work.running.pop(line, None)
            if not task.cancelled() and (failure := task.exception()) is not None:
                logger.error("batch %s line %d failed; it runs again", batch_id, line,
                             exc_info=failure)  # fmt: skip
                work.todo.appendleft(index)
        self.wake()

    async def _run_line(self, row: BatchRow, kind: Kind, caller: Caller, line: BatchLine) -> None:
        while True:
            rid = request_id(None).decode()
            model, prompt, completion = self._reserve(kind, caller, line.body)
            attempt = Attempt(row.id, line.line, rid, row.key_id, model, prompt, completion)
            self._store.start_attempt(attempt)
            try:
                result = await self._execute(kind, caller, line.body, row.endpoint, rid)
            except BaseException:
                # Cut here (a stop, a cancel) or failed: the run was charged as it ended.
                self._store.drop_attempt(rid)
                raise
            retry = result.retry_after_s
            if retry is None:
                break
            self._store.drop_attempt(rid)  # refused for now: nothing ran
            if self._clock() + retry >= row.expires_at or self._stopping(row.id):
                return  # not run: the batch ends without it
            work = self._work[row.id]
            work.retrying.add(line.line)
            try:
                await asyncio.sleep(retry)
            finally:
                work.retrying.discard(line.line)
            if self._stopping(row.id):
                return
        ok = 200 <= result.status < 300
        text = _output_line(line.custom_id, result)
        self._store.add_result(row.id, line.line, line.custom_id, ok=ok, text=text, attempt=rid)
        self._count_line("completed" if ok else "failed")
        if (ended := self._work.get(row.id)) is not None:
            ended.done.add(line.line)
            ended.completed, ended.failed = ended.completed + ok, ended.failed + (not ok)

    def _stopping(self, batch_id: str) -> bool:
        """Cancelled (or gone) while a line waited to retry."""
        return self._store.batch_status(batch_id) != "in_progress"

    async def _end_when_idle(self, row: BatchRow, final: BatchStatus, now: float) -> None:
        """Cancelled, expired or failed: no new line starts; once none runs, the files are
        written from what was done."""
        work = self._work.get(row.id)
        if work is not None:
            for waiting in work.retrying:
                work.running[waiting].cancel()
        if self.running(row.id):
            return
        expected = row.status
        row.status = "finalizing"
        row.times["finalizing_at"] = int(now)
        row.times[f"{final}_at"] = int(now)  # also what a restart finishes it as
        if self._store.save_batch(row, expected):
            await self._finish(row, final, now)

    async def _finish(self, row: BatchRow, final: BatchStatus, now: float) -> None:
        results = self._store.results(row.id)
        outputs = [text for _, ok, text in results if ok]
        failures = [text for _, ok, text in results if not ok]
        if final == "expired":
            done = {line for line, _, _ in results}
            work = self._work.get(row.id)
            for line in work.lines if work else []:
                if line.line not in done:
                    failures.append(_expired_line(line.custom_id))
                    self._count_line("expired")
        row.completed, row.failed = len(outputs), len(failures)
        if final != "failed" or results:
            row.output_file_id = self._output_file(row, "output", outputs, now)
            row.error_file_id = self._output_file(row, "error", failures, now)
        row.status = final
        row.times[f"{final}_at"] = int(now)
        self._store.save_batch(row, "finalizing")
        self._work.pop(row.id, None)

    def _output_file(self, row: BatchRow, which: str, lines: list[str], now: float) -> str | None:
        if not lines:
            return None
        data = ("\n".join(lines) + "\n").encode()
        file_id = new_id("file-")
        self._contents.write(file_id, data)
        self._store.add_file(
            FileRow(
                file_id,
                row.key_id,
                f"{row.id}_{which}.jsonl",
                OUTPUT_PURPOSE,
                len(data),
                int(now),
                int(now) + FILE_TTL_S,
            )
        )
        return file_id


def _final_of(row: BatchRow) -> BatchStatus:
    """The end a batch found `finalizing` was headed for (its timestamps say)."""
    for final in ("cancelled", "expired", "failed"):
        if f"{final}_at" in row.times:
            return final
    return "completed"


def _output_line(custom_id: str, result: LineResult) -> str:
    try:
        body: object = json.loads(result.body) if result.body else None
    except ValueError:
        body = result.body.decode("utf-8", "replace")
    response = {"status_code": result.status, "request_id": result.request_id, "body": body}
    return dumps(
        {"id": new_id("batch_req_"), "custom_id": custom_id, "response": response, "error": None}
    )


def _expired_line(custom_id: str) -> str:
    message = "This request could not be executed before the completion window expired."
    return dumps(
        {
            "id": new_id("batch_req_"),
            "custom_id": custom_id,
            "response": None,
            "error": {"code": "batch_expired", "message": message},
        }
    )
