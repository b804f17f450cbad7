"""What the event loop adds up between two writes of the ledger.

    tally = Tally()
    tally.add("key_ab12cd34", "qwen3-tiny", 12, 30)     # on the event loop, per request
    tally.add("key_ab12cd34", "qwen3-tiny", 5, 9, batch=True)    # a Batch API line
    batch = tally.take()     # {("2026-03-01", "key_ab12cd34", "qwen3-tiny"): [17, 39, 5, 9]}

A row's counts are the tokens of every request (interactive and Batch API lines alike), then
the part of them that batch lines used: totals first, so that a gateway which does not tell
batch tokens apart, sharing the store, still reads and adds the totals.

Adding is one dict lookup and two integer additions (the day is worked out again only when
the clock leaves the day it last saw), so recording costs a request well under a
microsecond; the writing happens elsewhere, a batch at a time (`recorder`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple

from serving.gateway.usage_ledger.days import day_span

# (UTC day, key id, model) -> [prompt, completion, batch prompt, batch completion] tokens
Row = tuple[str, str, str]
Batch = dict[Row, list[int]]


class UsageRow(NamedTuple):
    """One row of the ledger as it is read back: a key's tokens on one model on one day, all
    of them, and the part of them that Batch API lines used."""

    day: str
    key_id: str
    model: str
    prompt_tokens: int
    completion_tokens: int
    batch_prompt_tokens: int = 0
    batch_completion_tokens: int = 0


def batch_rows(batch: Batch) -> list[UsageRow]:
    return [UsageRow(*row, *counts) for row, counts in batch.items()]


class Tally:
    """Not thread-safe: one event loop adds and takes."""

    __slots__ = ("_day", "_ends", "_now", "_rows", "_starts")

    def __init__(self, now: Callable[[], float] = time.time) -> None:
        self._now = now
        self._rows: Batch = {}
        self._day = ""
        self._starts = self._ends = 0.0

    def __len__(self) -> int:
        return len(self._rows)

    def add(
        self,
        key_id: str,
        model: str,
        prompt_tokens: int,
        completion_tokens: int,
        *,
        batch: bool = False,
    ) -> None:
        """Add a request's tokens; `batch` for a Batch API line's."""
        now = self._now()
        if not self._starts <= now < self._ends:  # a new day (or the clock was set back)
            self._day, self._starts, self._ends = day_span(now)
        row = (self._day, key_id, model)
        counts = self._rows.get(row)
        if counts is None:
            counts = self._rows[row] = [0, 0, 0, 0]
        counts[0] += prompt_tokens
        counts[1] += completion_tokens
        if batch:
            counts[2] += prompt_tokens
            counts[3] += completion_tokens

    def take(self) -> Batch:
        """Everything added since the last take; the tally starts empty again."""
        rows, self._rows = self._rows, {}
        return rows
