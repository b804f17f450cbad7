"""The recorder: per-request work is a tally update; batches are written in the background,
one per interval, each applied exactly once even when a write fails or its answer is lost."""

from __future__ import annotations

import asyncio
import copy
import logging
from dataclasses import dataclass

import pytest

from serving.gateway.usage_ledger import recorder as recorder_module
from serving.gateway.usage_ledger.recorder import UsageRecorder
from serving.gateway.usage_ledger.tally import Batch, UsageRow, batch_rows
from tests.gateway.quota.running import run_async

NOW = 1_772_323_200.0  # 2026-03-01T00:00:00Z
DAY = "2026-03-01"
# Generous: only bounds how long a broken test hangs, never waited out.
DEADLINE_S = 30.0


@dataclass
class Record:
    key: str
    model: str
    prompt_tokens: int
    completion_tokens: int


class ListStore:
    """A `LedgerStore` in memory that applies batches as the real ones do (marks), and fails
    on demand: before applying (`fail`) or after (`lose_answer`)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, Batch]] = []
        self.rows: Batch = {}
        self.marks: dict[str, int] = {}
        self.fail = 0
        self.lose_answer = False
        self.closed = False

    async def write(self, writer: str, number: int, batch: Batch) -> None:
        self.calls.append((writer, number, copy.deepcopy(batch)))
        if self.fail:
            self.fail -= 1
            raise OSError("store says no")
        if self.marks.get(writer, 0) < number:
            for row, counts in batch.items():
                held = self.rows.setdefault(row, [0, 0, 0, 0])
                for at, tokens in enumerate(counts):
                    held[at] += tokens
            self.marks[writer] = number
        if self.lose_answer:
            self.lose_answer = False
            raise TimeoutError("the answer was lost")

    async def read(self, first: str, last: str, key_id: str | None) -> list[UsageRow]:
        return [
            row
            for row in batch_rows(self.rows)
            if first <= row.day <= last and key_id in (None, row.key_id)
        ]

    async def close(self) -> None:
        self.closed = True


def recorder_over(store: ListStore, interval_s: float = 0.05) -> UsageRecorder:
    return UsageRecorder(store, interval_s=interval_s, now=lambda: NOW)


@run_async
async def test_requests_are_added_up_and_written_once_per_interval() -> None:
    store = ListStore()
    recorder = recorder_over(store, interval_s=0.2)
    for _ in range(500):
        recorder.record(Record("key_a", "m1", 3, 5))
        recorder.record(Record("key_b", "m2", 1, 0))
        recorder.record(Record("none", "none", 0, 0))  # charged nothing: no row
    assert store.calls == []  # nothing touches the store on the request path
    assert await recorder.flush(DEADLINE_S)
    assert len(store.calls) == 1
    assert sorted(await recorder.read(DAY, DAY, None)) == [
        UsageRow(DAY, "key_a", "m1", 1500, 2500),
        UsageRow(DAY, "key_b", "m2", 500, 0),
    ]
    assert await recorder.read(DAY, DAY, "key_b") == [UsageRow(DAY, "key_b", "m2", 500, 0)]
    assert await recorder.flush(0)  # nothing left: at once
    await recorder.close()
    assert store.closed


@run_async
async def test_a_batch_lines_tokens_are_marked_as_such() -> None:
    store = ListStore()
    recorder = recorder_over(store, interval_s=0.01)
    recorder.record(Record("key_a", "m1", 3, 5))
    recorder.record(Record("key_a", "m1", 7, 1), batch=True)
    recorder.record(Record("key_a", "m1", 0, 0), batch=True)  # charged nothing: no row
    assert await recorder.flush(DEADLINE_S)
    assert await recorder.read(DAY, DAY, None) == [UsageRow(DAY, "key_a", "m1", 10, 6, 7, 1)]
    await recorder.close()


@run_async
async def test_the_writer_task_ends_when_there_is_nothing_to_write() -> None:
    store = ListStore()
    recorder = recorder_over(store, interval_s=0.01)
    before = len(asyncio.all_tasks())
    recorder.record(Record("key_a", "m1", 1, 1))
    assert len(asyncio.all_tasks()) == before + 1
    assert await recorder.flush(DEADLINE_S)
    await asyncio.sleep(0.1)
    assert len(asyncio.all_tasks()) == before  # idle: nothing runs
    recorder.record(Record("key_a", "m1", 1, 1))  # and the next request starts it again
    assert await recorder.flush(DEADLINE_S)
    assert store.rows == {(DAY, "key_a", "m1"): [2, 2, 0, 0]}
    await recorder.close()


@run_async
async def test_a_failed_write_is_retried_with_the_same_batch_and_logged(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(recorder_module, "RETRY_FIRST_S", 0.01)
    caplog.set_level(logging.WARNING, logger=recorder_module.__name__)
    store = ListStore()
    store.fail = 3
    recorder = recorder_over(store, interval_s=0.01)
    recorder.record(Record("key_a", "m1", 10, 1))
    while recorder.failures() < 2:
        await asyncio.sleep(0.005)
    recorder.record(Record("key_a", "m1", 5, 5))  # during the retries: the next batch
    assert await recorder.flush(DEADLINE_S)
    writer = store.calls[0][0]
    numbers = [number for who, number, _ in store.calls if who == writer]
    assert numbers == [1, 1, 1, 1, 2]
    assert all(
        batch == {(DAY, "key_a", "m1"): [10, 1, 0, 0]} for _, n, batch in store.calls if n == 1
    )
    assert store.rows == {(DAY, "key_a", "m1"): [15, 6, 0, 0]}
    assert recorder.failures() == 3
    messages = [record.getMessage() for record in caplog.records]
    assert any("could not write 1 rows (attempt 1)" in m and "store says no" in m for m in messages)
    assert any("written again after 3 failed attempts" in m for m in messages)
    await recorder.close()


@run_async
async def test_a_write_whose_answer_was_lost_is_not_applied_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(recorder_module, "RETRY_FIRST_S", 0.01)
    store = ListStore()
    store.lose_answer = True
    recorder = recorder_over(store, interval_s=0.01)
    recorder.record(Record("key_a", "m1", 7, 3))
    assert await recorder.flush(DEADLINE_S)
    assert [number for _, number, _ in store.calls] == [1, 1]
    assert store.rows == {(DAY, "key_a", "m1"): [7, 3, 0, 0]}
    await recorder.close()


@run_async
async def test_close_writes_what_is_left_or_says_what_it_could_not(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(recorder_module, "RETRY_FIRST_S", 0.01)
    store = ListStore()
    recorder = recorder_over(store, interval_s=60)  # only close writes it
    recorder.record(Record("key_a", "m1", 1, 2))
    await recorder.close()
    assert store.rows == {(DAY, "key_a", "m1"): [1, 2, 0, 0]} and store.closed
    recorder.record(Record("key_a", "m1", 1, 2))  # after close: logged, dropped
    assert store.rows == {(DAY, "key_a", "m1"): [1, 2, 0, 0]}

    caplog.set_level(logging.ERROR, logger=recorder_module.__name__)
    broken = ListStore()
    broken.fail = 10**9
    recorder = recorder_over(broken)
    recorder.record(Record("key_a", "m1", 1, 2))
    recorder.record(Record("key_b", "m1", 1, 2))
    assert not await recorder.flush(0.05)
    await recorder.close(timeout=0.1)
    assert broken.rows == {} and broken.closed
    assert "2 rows of usage were not written" in caplog.text
