"""Lease endings the Redis store has not sent yet: each rides on the store's next call, so a
request costs one round trip (docs/gateway.md, shared quotas).

    queue = SettleQueue(delay_s=0.005, retry_s=1.0, due=start_flush)
    queue.put(Ending(lease_id, key_id, charge, cancel=False, lease=lease))  # finish(): no I/O
    batch = queue.take(256)               # the next script call carries these ...
    queue.delivered(batch)                # ... and they arrived,
    queue.returned(batch)                 # ... or the call failed: they wait again

Rules:
- with no call coming, a flush is due (`due`) once an ending has waited `delay_s`, which
  bounds how long other replicas see a finished request's slot as taken; one timer, armed
  by the first ending and re-armed only when it fires;
- endings whose call failed are due again `retry_s` later, not at every ending;
- an ending is known by its lease id while queued and while a call carries it (`in`), so a
  second ending of the same lease is noticed; `len` counts both.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import NamedTuple

from serving.gateway.quota.decision import Lease


class Ending(NamedTuple):
    """One lease to end in Redis."""

    lease_id: str
    key_id: str
    charge: int
    cancel: bool
    """A reservation whose answer was lost: if it never arrived, it must never book."""
    lease: Lease | None
    """The lease object to tell how it really ended, if Redis knew better (None for a
    cancelled reservation)."""
    withdraw: bool = False
    """Refused after admission (`LeaseState.WITHDRAWN`): the request leaves requests/min too."""


class SettleQueue:
    def __init__(self, *, delay_s: float, retry_s: float, due: Callable[[], None]) -> None:
        self._delay_s = delay_s
        self._retry_s = retry_s
        self._due = due
        # lease id -> (ending, loop time it is due to be sent by itself)
        self._queued: dict[str, tuple[Ending, float]] = {}
        self._carried: dict[str, Ending] = {}
        self._timer: asyncio.TimerHandle | None = None

    def __contains__(self, lease_id: str) -> bool:
        return lease_id in self._queued or lease_id in self._carried

    def __len__(self) -> int:
        return len(self._queued) + len(self._carried)

    def waiting(self) -> int:
        """Endings queued and not on their way."""
        return len(self._queued)

    def put(self, ending: Ending) -> None:
        loop = asyncio.get_running_loop()
        self._queued[ending.lease_id] = (ending, loop.time() + self._delay_s)
        if self._timer is None:
            self._timer = loop.call_later(self._delay_s, self._on_timer)

    def take(self, limit: int) -> list[Ending]:
        """Up to `limit` queued endings, oldest first, now on their way."""
        queued = self._queued
        if not queued:
            return []
        if len(queued) <= limit:
            batch = [ending for ending, _ in queued.values()]
            queued.clear()
        else:
            batch = [queued.pop(lease_id)[0] for lease_id in list(queued)[:limit]]
        carried = self._carried
        for ending in batch:
            carried[ending.lease_id] = ending
        return batch

    def delivered(self, batch: list[Ending]) -> None:
        for ending in batch:
            self._carried.pop(ending.lease_id, None)

    def returned(self, batch: list[Ending]) -> None:
        """The call carrying `batch` failed: each is due again after `retry_s` (ending a
        lease is idempotent, so one that did arrive is not charged again)."""
        if not batch:
            return
        loop = asyncio.get_running_loop()
        due_at = loop.time() + self._retry_s
        for ending in batch:
            if self._carried.pop(ending.lease_id, None) is not None:
                self._queued[ending.lease_id] = (ending, due_at)
        if self._timer is None:
            self._timer = loop.call_later(self._retry_s, self._on_timer)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _on_timer(self) -> None:
        self._timer = None
        if not self._queued:
            return
        loop = asyncio.get_running_loop()
        wait = min(due_at for _, due_at in self._queued.values()) - loop.time()
        if wait > 0:
            # Under load, calls took what was due and left only endings younger than the
            # delay: they will most likely ride on a call too.
            self._timer = loop.call_later(wait, self._on_timer)
            return
        self._due()
