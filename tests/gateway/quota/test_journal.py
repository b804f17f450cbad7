"""Day and month budgets on disk: settled charges, added up across writers, never lost or
counted twice when a write fails, and reloaded on start."""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from serving.gateway.metrics import GatewayMetrics
from serving.gateway.quota import (
    Admission,
    InMemoryQuotaStore,
    Limits,
    ManualClock,
    QuotaEngine,
    Refusal,
    RefusalReason,
    Scope,
    SqliteBudgetJournal,
)
from serving.gateway.quota import journal as journal_module
from serving.gateway.quota.journal import BudgetKind, Charge
from tests.gateway.conftest import eventually
from tests.gateway.quota.running import run_async
from tests.gateway.quota.subjects import Subject, utc
from tests.gateway.sqlite_faults import CommitThenFail, connect_commit_then_fail

KEY = Subject("key_a", Limits(tokens_per_day=1000), {"big": Limits(tokens_per_month=5000)})
DAY, MONTH = "2024-05-10", "2024-05"
# Generous: these only bound how long a broken test hangs, they are never waited out.
DEADLINE_S = 30.0

Rows = dict[tuple[str, str, str, str], int]


async def spend(engine: QuotaEngine, model: str, tokens: int) -> None:
    admission = await engine.admit(KEY, model, tokens, 1)
    assert isinstance(admission, Admission), admission
    assert await engine.settle(admission.lease, tokens, 0)


def persisted(path: Path) -> Rows:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        rows = conn.execute("SELECT key_id, model, kind, period, spent FROM quota_budgets")
        return {(key, model, kind, period): spent for key, model, kind, period, spent in rows}


def both(key: str, model: str, tokens: int, day: str = DAY, month: str = MONTH) -> Rows:
    return {(key, model, "day", day): tokens, (key, model, "month", month): tokens}


@pytest.fixture
def journal(path: Path) -> Iterator[SqliteBudgetJournal]:
    opened = SqliteBudgetJournal(path, busy_timeout_s=0.05)
    yield opened
    opened.close(timeout=1)


# -- the store: what it hands to the journal -------------------------------------------


class ListJournal:
    def __init__(self, loaded: dict[tuple[Scope, BudgetKind], int] | None = None) -> None:
        self.loaded = loaded or {}
        self.charges: list[Charge] = []

    def load(self, day: str, month: str) -> dict[tuple[Scope, BudgetKind], int]:
        return dict(self.loaded)

    def record(self, charge: Charge) -> None:
        self.charges.append(charge)


@run_async
async def test_the_store_records_settled_charges_never_reservations() -> None:
    journal = ListJournal()
    clock = ManualClock(wall=utc(2024, 5, 10, 23, 59, 30))
    engine = QuotaEngine(InMemoryQuotaStore(clock, journal=journal), lease_ttl=60)
    settled = await engine.admit(KEY, "big", 10, 100)
    aborted = await engine.admit(KEY, "m", 10, 100)
    failed = await engine.admit(KEY, "m", 10, 100)
    running = await engine.admit(KEY, "m", 10, 100)
    assert isinstance(settled, Admission) and isinstance(aborted, Admission)
    assert isinstance(failed, Admission) and isinstance(running, Admission)
    assert journal.charges == []  # reservations are not spending
    clock.advance(45)  # past midnight: charges still belong to the day they were admitted in
    assert await engine.settle(settled.lease, 7, 20)
    assert await engine.abort(aborted.lease, 10, 3)
    assert await engine.fail(failed.lease)  # charges nothing, so records nothing
    key, big = Scope("key_a"), Scope("key_a", "big")
    assert journal.charges == [
        Charge((key, big), DAY, MONTH, 27),
        Charge((key,), DAY, MONTH, 13),
    ]
    clock.advance(60)
    assert await engine.reclaim_expired() == 1  # nobody ended it: its whole reservation is charged
    assert journal.charges[-1] == Charge((key,), DAY, MONTH, 110)


@run_async
async def test_the_store_starts_from_the_journaled_totals() -> None:
    journal = ListJournal({(Scope("key_a"), "day"): 900, (Scope("key_a", "big"), "month"): 40})
    store = InMemoryQuotaStore(ManualClock(wall=utc(2024, 5, 10, 12)), journal=journal)
    assert (await store.usage(Scope("key_a"))).tokens_today == 900
    assert (await store.usage(Scope("key_a", "big"))).tokens_this_month == 40
    refusal = await QuotaEngine(store).admit(KEY, "m", 100, 1)
    assert isinstance(refusal, Refusal) and refusal.reason is RefusalReason.DAILY


# -- the journal on disk ------------------------------------------------------------------


@run_async
async def test_budgets_are_reloaded_after_a_restart(path: Path) -> None:
    clock = ManualClock(wall=utc(2024, 5, 10, 12))
    journal = SqliteBudgetJournal(path)
    engine = QuotaEngine(InMemoryQuotaStore(clock, journal=journal))
    await spend(engine, "m", 300)
    await spend(engine, "big", 400)
    journal.close()
    assert journal.unwritten() == 0

    reopened = SqliteBudgetJournal(path)
    restarted = QuotaEngine(InMemoryQuotaStore(clock, journal=reopened))
    assert (await restarted.store.usage(Scope("key_a"))).tokens_today == 700
    assert (await restarted.store.usage(Scope("key_a", "big"))).tokens_this_month == 400
    refusal = await restarted.admit(KEY, "m", 301, 1)  # 700 + 302 > 1000
    assert isinstance(refusal, Refusal)
    assert refusal.reason is RefusalReason.DAILY
    reopened.close()


@run_async
async def test_loaded_budgets_expire_with_their_period(path: Path) -> None:
    clock = ManualClock(wall=utc(2024, 5, 10, 23, 59))
    journal = SqliteBudgetJournal(path)
    await spend(QuotaEngine(InMemoryQuotaStore(clock, journal=journal)), "m", 900)
    journal.close()
    reopened = SqliteBudgetJournal(path)
    restarted = InMemoryQuotaStore(clock, journal=reopened)
    clock.advance(60)  # the budget was loaded on May 10th; it is May 11th now
    assert (await restarted.usage(Scope("key_a"))).tokens_today == 0
    assert (await restarted.usage(Scope("key_a"))).tokens_this_month == 900
    reopened.close()


@run_async
async def test_charges_are_written_as_they_settle_and_reservations_never(
    path: Path, journal: SqliteBudgetJournal
) -> None:
    engine = QuotaEngine(
        InMemoryQuotaStore(ManualClock(wall=utc(2024, 5, 10, 12)), journal=journal)
    )
    await spend(engine, "m", 10)
    running = await engine.admit(KEY, "m", 50, 50)
    assert isinstance(running, Admission)
    # Nothing calls flush(): the writer thread commits by itself, at once.
    assert eventually(lambda: persisted(path) == both("key_a", "", 10), DEADLINE_S)
    assert journal.drain(DEADLINE_S)
    assert persisted(path) == both("key_a", "", 10)  # the running request's 100 are not there
    assert await engine.settle(running.lease, 50, 7)
    assert journal.drain(DEADLINE_S)
    assert persisted(path) == both("key_a", "", 67)


@run_async
async def test_two_journals_on_one_file_add_up(path: Path) -> None:
    """Two writers (as two gateway processes would be) recording concurrently from threads:
    every row is the sum of both, where overwriting would keep only one writer's total."""
    journals = [SqliteBudgetJournal(path), SqliteBudgetJournal(path)]
    charges = 400
    start = threading.Barrier(len(journals))

    def feed(journal: SqliteBudgetJournal, tokens: int) -> None:
        start.wait()
        for index in range(charges):
            scopes = (Scope("key_a"), Scope("key_a", "big")) if index % 2 else (Scope("key_a"),)
            journal.record(Charge(scopes, DAY, MONTH, tokens))
            if index % 50 == 0:
                time.sleep(0)  # let the writers interleave with the feeding

    threads = [
        threading.Thread(target=feed, args=(journal, tokens))
        for journal, tokens in zip(journals, (1, 1000), strict=True)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(DEADLINE_S)
    for journal in journals:
        journal.close(timeout=DEADLINE_S)
        assert journal.unwritten() == 0
    key_total = charges * (1 + 1000)
    assert persisted(path) == both("key_a", "", key_total) | both("key_a", "big", key_total // 2)
    reopened = SqliteBudgetJournal(path)
    assert reopened.load(DAY, MONTH) == {
        (Scope("key_a"), "day"): key_total,
        (Scope("key_a"), "month"): key_total,
        (Scope("key_a", "big"), "day"): key_total // 2,
        (Scope("key_a", "big"), "month"): key_total // 2,
    }
    reopened.close()


@run_async
async def test_a_failed_write_is_counted_logged_and_retried_with_the_same_deltas(
    path: Path, journal: SqliteBudgetJournal, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=journal_module.__name__)
    metrics = GatewayMetrics(budget_flush_failures=journal.failures)
    journal.record(Charge((Scope("key_a"),), DAY, MONTH, 1))
    assert journal.drain(DEADLINE_S)
    # A real SQLite failure late in the transaction, after the budget rows were updated:
    # the rollback must undo those, and the retry must apply them exactly once.
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        for event in ("INSERT", "UPDATE"):
            conn.execute(
                f"CREATE TRIGGER refuse_{event.lower()} BEFORE {event} ON quota_budget_writers"
                " BEGIN SELECT RAISE(ABORT, 'disk says no'); END"
            )
    journal.record(Charge((Scope("key_a"), Scope("key_a", "big")), DAY, MONTH, 10))
    assert eventually(lambda: journal.failures() >= 2, DEADLINE_S)
    journal.record(Charge((Scope("key_a"),), DAY, MONTH, 100))  # arrives during the retries
    assert persisted(path) == both("key_a", "", 1)
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("DROP TRIGGER refuse_insert")
        conn.execute("DROP TRIGGER refuse_update")
    assert journal.drain(DEADLINE_S)
    assert persisted(path) == both("key_a", "", 111) | both("key_a", "big", 10)

    failures = journal.failures()
    samples = {
        sample.name: sample.value
        for family in text_string_to_metric_families(metrics.render().decode())
        for sample in family.samples
    }
    assert samples["gateway_budget_flush_failures_total"] == failures >= 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("could not write" in message and "disk says no" in message for message in warnings)
    assert any("written again" in message for message in warnings)


@run_async
async def test_a_commit_that_failed_after_taking_effect_is_not_applied_twice(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(CommitThenFail, "armed", True)
    monkeypatch.setattr(journal_module, "connect_wal", connect_commit_then_fail)
    journal = SqliteBudgetJournal(path, busy_timeout_s=0.05)
    journal.record(Charge((Scope("key_a"),), DAY, MONTH, 5))
    assert journal.drain(DEADLINE_S)
    assert journal.failures() == 1
    journal.record(Charge((Scope("key_a"),), DAY, MONTH, 7))
    journal.close(timeout=DEADLINE_S)
    assert journal.unwritten() == 0
    assert persisted(path) == both("key_a", "", 12)


@run_async
async def test_record_never_touches_the_disk(path: Path) -> None:
    """With the file locked by someone else and a long busy timeout, recording (on the
    event loop, in the gateway) still returns at once; the writer catches up afterwards."""
    journal = SqliteBudgetJournal(path, busy_timeout_s=60)
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")
    try:
        started = time.monotonic()
        for _ in range(100):
            journal.record(Charge((Scope("key_a"),), DAY, MONTH, 1))
        assert time.monotonic() - started < 10  # blocking would take 60 s per record
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    journal.close(timeout=DEADLINE_S)
    assert journal.unwritten() == 0
    assert persisted(path) == both("key_a", "", 100)


@run_async
async def test_close_drains_the_queue(path: Path) -> None:
    journal = SqliteBudgetJournal(path)
    for tokens in range(1, 1001):
        journal.record(Charge((Scope("key_a"),), DAY, MONTH, tokens))
    journal.close(timeout=DEADLINE_S)  # right away: what is queued is written first
    assert journal.unwritten() == 0
    assert persisted(path) == both("key_a", "", 1000 * 1001 // 2)
    journal.record(Charge((Scope("key_a"),), DAY, MONTH, 1))  # after close: dropped, logged
    assert persisted(path) == both("key_a", "", 1000 * 1001 // 2)


@run_async
async def test_close_gives_up_at_its_deadline_and_says_so(
    path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    journal = SqliteBudgetJournal(path, busy_timeout_s=0.05)
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")
    try:
        journal.record(Charge((Scope("key_a"),), DAY, MONTH, 3))
        assert eventually(lambda: journal.failures() >= 1, DEADLINE_S)
        journal.close(timeout=0.2)
        assert journal.unwritten() == 2  # the day and the month row
        assert not journal.drain(0)
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert persisted(path) == {}
    assert any("were not written" in r.getMessage() for r in caplog.records)


@run_async
async def test_marks_of_writers_gone_for_a_month_are_pruned(path: Path) -> None:
    SqliteBudgetJournal(path).close()  # creates the tables
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("INSERT INTO quota_budget_writers VALUES ('gone', 7, '2000-01-01')")
        conn.execute("INSERT INTO quota_budget_writers VALUES ('recent', 7, '2999-01-01')")
    journal = SqliteBudgetJournal(path)
    journal.record(Charge((Scope("key_a"),), DAY, MONTH, 1))
    journal.close(timeout=DEADLINE_S)
    with contextlib.closing(sqlite3.connect(path)) as conn:
        writers = [row[0] for row in conn.execute("SELECT writer FROM quota_budget_writers")]
    assert "gone" not in writers and "recent" in writers and len(writers) == 2
