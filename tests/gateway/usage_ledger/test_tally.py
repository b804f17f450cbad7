"""The event loop's tally: one row per (UTC day, key, model), days cut at midnight UTC."""

from __future__ import annotations

import calendar

from serving.gateway.usage_ledger.tally import Tally, UsageRow, batch_rows

MIDNIGHT = calendar.timegm((2026, 3, 2, 0, 0, 0))


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_requests_add_up_per_day_key_and_model() -> None:
    clock = Clock(MIDNIGHT - 2)
    tally = Tally(clock)
    tally.add("key_a", "m1", 3, 4)
    tally.add("key_a", "m1", 10, 20)
    tally.add("key_a", "m2", 1, 0)
    tally.add("key_b", "m1", 0, 5)
    clock.now = MIDNIGHT  # the next day, to the second
    tally.add("key_a", "m1", 7, 7)
    clock.now = MIDNIGHT - 1  # a clock set back a second: back to its day
    tally.add("key_a", "m1", 1, 1)
    assert len(tally) == 4
    assert sorted(batch_rows(tally.take())) == [
        UsageRow("2026-03-01", "key_a", "m1", 14, 25),
        UsageRow("2026-03-01", "key_a", "m2", 1, 0),
        UsageRow("2026-03-01", "key_b", "m1", 0, 5),
        UsageRow("2026-03-02", "key_a", "m1", 7, 7),
    ]
    assert len(tally) == 0 and tally.take() == {}


def test_batch_lines_count_in_the_totals_and_apart() -> None:
    tally = Tally(Clock(MIDNIGHT - 2))
    tally.add("key_a", "m1", 3, 4)
    tally.add("key_a", "m1", 10, 20, batch=True)
    tally.add("key_a", "m1", 1, 2, batch=True)
    tally.add("key_b", "m1", 5, 0, batch=True)
    assert sorted(batch_rows(tally.take())) == [
        UsageRow("2026-03-01", "key_a", "m1", 14, 26, 11, 22),
        UsageRow("2026-03-01", "key_b", "m1", 5, 0, 5, 0),
    ]
