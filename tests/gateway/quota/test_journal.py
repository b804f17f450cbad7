"""Day and month budgets survive a restart of the single-process store."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path

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
from serving.gateway.quota.journal import BudgetKind, BudgetRow
from tests.gateway.quota.subjects import Subject, utc

KEY = Subject("key_a", Limits(tokens_per_day=1000), {"big": Limits(tokens_per_month=5000)})


def spend(engine: QuotaEngine, model: str, tokens: int) -> None:
    admission = engine.admit(KEY, model, tokens, 1)
    assert isinstance(admission, Admission), admission
    assert engine.settle(admission.lease, tokens, 0)


def test_budgets_are_reloaded_after_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "keys.db"
    clock = ManualClock(wall=utc(2024, 5, 10, 12))
    store = InMemoryQuotaStore(clock, journal=SqliteBudgetJournal(path))
    engine = QuotaEngine(store)
    spend(engine, "m", 300)
    spend(engine, "big", 400)
    store.flush()

    restarted = QuotaEngine(InMemoryQuotaStore(clock, journal=SqliteBudgetJournal(path)))
    assert restarted.store.usage(Scope("key_a")).tokens_today == 700
    assert restarted.store.usage(Scope("key_a", "big")).tokens_this_month == 400
    refusal = restarted.admit(KEY, "m", 301, 1)  # 700 + 302 > 1000
    assert isinstance(refusal, Refusal)
    assert refusal.reason is RefusalReason.DAILY


def test_loaded_budgets_expire_with_their_period(tmp_path: Path) -> None:
    path = tmp_path / "keys.db"
    clock = ManualClock(wall=utc(2024, 5, 10, 23, 59))
    store = InMemoryQuotaStore(clock, journal=SqliteBudgetJournal(path))
    spend(QuotaEngine(store), "m", 900)
    store.flush()
    restarted = InMemoryQuotaStore(clock, journal=SqliteBudgetJournal(path))
    clock.advance(60)  # the budget was loaded on May 10th; it is May 11th now
    assert restarted.usage(Scope("key_a")).tokens_today == 0
    assert restarted.usage(Scope("key_a")).tokens_this_month == 900


def test_store_flushes_by_itself_at_most_every_interval(tmp_path: Path) -> None:
    path = tmp_path / "keys.db"
    clock = ManualClock(wall=utc(2024, 5, 10, 12))
    store = InMemoryQuotaStore(clock, journal=SqliteBudgetJournal(path), flush_interval=1.0)
    engine = QuotaEngine(store)

    def persisted() -> list[tuple[str, str, str, str, int]]:
        with sqlite3.connect(path) as conn:
            return conn.execute(
                "SELECT key_id, model, kind, period, spent FROM quota_budgets ORDER BY 1, 2, 3"
            ).fetchall()

    spend(engine, "m", 10)
    assert persisted() == []  # within the interval: no disk write on this request
    clock.advance(1.0)
    spend(engine, "m", 20)
    assert persisted() == [
        ("key_a", "", "day", "2024-05-10", 30),
        ("key_a", "", "month", "2024-05", 30),
    ]


class RefusingJournal:
    def __init__(self) -> None:
        self.saved: list[BudgetRow] = []
        self.fail = True

    def load(self, day: str, month: str) -> dict[tuple[Scope, BudgetKind], int]:
        return {}

    def save(self, rows: Sequence[BudgetRow]) -> bool:
        if self.fail:
            return False
        self.saved.extend(rows)
        return True


def test_a_failed_save_is_retried_with_the_next_flush() -> None:
    journal = RefusingJournal()
    store = InMemoryQuotaStore(ManualClock(wall=utc(2024, 5, 10, 12)), journal=journal)
    spend(QuotaEngine(store), "m", 10)
    store.flush()
    assert journal.saved == []
    journal.fail = False
    store.flush()
    assert {(row.kind, row.spent) for row in journal.saved} == {("day", 10), ("month", 10)}


def test_journal_survives_a_read_only_database(tmp_path: Path) -> None:
    journal = SqliteBudgetJournal(tmp_path / "keys.db")
    journal.close()
    # A closed connection stands in for any SQLite failure: reported, never raised.
    assert not journal.save([BudgetRow(Scope("key_a"), "day", "2024-05-10", 1)])
