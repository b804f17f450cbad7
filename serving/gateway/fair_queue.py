"""Fair sharing of the engines' slots between keys: virtual token counting (VTC; Sheng et al.,
"Fairness in Serving Large Language Models", OSDI 2024). The why and the measurements:
docs/fair-sharing.md.

    queue = FairQueue(slots=16, reserved=2, timeout_s=30.0)
    turn = await queue.turn(key_id, cost=prompt_estimate + max_tokens, gone=client_gone)
    try:
        ...forward the request...
    finally:
        queue.release(turn, served=tokens_charged)

Rules:
- at most `slots` sequences run at once (a request takes one per choice), one key's at most
  `slots - reserved`; the rest wait here, per key;
- a free slot goes to the waiting key with the lowest counter (tokens served / weight); a
  key that becomes active again is lifted to the lowest active counter, and with nothing
  active the counters restart from zero; within a key, the oldest request goes first;
- a request waits at most `timeout_s` (`QueueTimeout`) and leaves at once when its client
  goes away; with a slot free and nothing waiting, `turn` does not suspend;
- the lowest class (`lowest_class()`: Batch API lines) waits behind every other request: a
  waiter of it is served only while no other waiter could take a free slot (each one left is
  held back by its own key's share), and it never starts at once while anything waits;
- with replicas sharing the slots (`share`, kept by `shared_slots.SharedSlots`), this queue
  runs at most its part of them, and a key at most its share here.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field

from serving.gateway.errors import ClientGone
from serving.gateway.failures import GatewayException
from serving.gateway.metrics import DURATION_BUCKETS, Histogram

# Set for the task that runs a request of the lowest class: the caller (`Completions`) is
# the same code for every request, so the class travels with the task, not as an argument.
_LOWEST: ContextVar[bool] = ContextVar("lowest_class", default=False)


@contextlib.contextmanager
def lowest_class() -> Iterator[None]:
    """The requests started inside wait in the lowest class (`FairQueue` rules)."""
    token = _LOWEST.set(True)
    try:
        yield
    finally:
        _LOWEST.reset(token)


def in_lowest_class() -> bool:
    """Whether the running task asks for turns in the lowest class."""
    return _LOWEST.get()


class QueueTimeout(GatewayException):
    """The request waited `FairQueue.timeout_s` without a slot."""


@dataclass(slots=True, eq=False)
class Turn:
    """A running request's slots: give them back with `FairQueue.release`."""

    key: str
    weight: float
    cost: int
    seats: int
    waited_s: float
    released: bool = False


@dataclass(slots=True, eq=False)
class _Waiter:
    key: str
    weight: float
    cost: int
    seats: int
    since: float
    future: asyncio.Future[Turn]
    lowest: bool = False


@dataclass(slots=True)
class KeyQueueStats:
    """What the metrics show per key."""

    waited: Histogram = field(default_factory=lambda: Histogram(DURATION_BUCKETS))
    timeouts: int = 0
    left: int = 0


class FairQueue:
    def __init__(
        self,
        slots: int,
        *,
        reserved: int,
        timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if slots < 1:
            raise ValueError(f"slots must be at least 1, got {slots}")
        if not 0 <= reserved < slots:
            raise ValueError(f"reserved must be between 0 and slots - 1, got {reserved}")
        self.engine_slots = slots
        """Every engine's slots (`resize`), shared with other replicas or not."""
        self.slots = slots
        """What this queue runs at most: `engine_slots`, or this replica's part of them."""
        self.reserved = reserved
        self.per_key = slots - reserved
        """The most one key may hold anywhere (wider requests are refused)."""
        self.timeout_s = timeout_s
        self.running = 0
        self._clock = clock
        self._shared = False
        self._caps: dict[str, int] | None = None
        """With shared slots: each key's share here (a key without one: `reserved`)."""
        self._running: dict[str, int] = {}
        self._weights: dict[str, float] = {}
        """The weight of each key's latest request started (for `demand`)."""
        self._waiting: dict[str, deque[_Waiter]] = {}
        self._lowest: dict[str, deque[_Waiter]] = {}
        """The lowest class's waiters, per key, apart: served when `_waiting` is empty."""
        self._waiting_total = 0
        """Waiters of every class."""
        self._virtual: dict[str, float] = {}
        self.stats: dict[str, KeyQueueStats] = {}

    def resize(self, slots: int) -> None:
        """The engines' slots changed (discovery added or drained one): at least
        reserved + 1. Running requests keep theirs; a smaller size only holds new ones back
        (a waiting request now wider than a key's share waits until the slots grow back, or
        its deadline: it never runs on fewer seats than vLLM runs sequences)."""
        self.engine_slots = max(slots, self.reserved + 1)
        self.per_key = self.engine_slots - self.reserved
        if not self._shared:  # else the next round of `SharedSlots` sets this replica's part
            self.slots = self.engine_slots
        self._dispatch()

    def share(self, slots: int, caps: dict[str, int] | None) -> None:
        """Run at most `slots` (this replica's part of `engine_slots`), each key at most its
        share in `caps` (a key without one: `reserved`, so a key new here starts at once);
        `caps` None: this queue's own rules, on `slots`. Running requests keep theirs."""
        self._shared = True
        self.slots = slots
        self._caps = caps
        self._dispatch()

    def demand(self) -> dict[str, tuple[int, int, float]]:
        """Seats each key runs or waits for here, of which it runs, and its weight (what the
        replicas share by)."""
        seats = dict(self._running)
        weights = {key: self._weights.get(key, 1.0) for key in seats}
        for key, queue in (*self._lowest.items(), *self._waiting.items()):
            seats[key] = seats.get(key, 0) + sum(waiter.seats for waiter in queue)
            weights[key] = queue[0].weight
        return {
            key: (count, self._running.get(key, 0), weights[key]) for key, count in seats.items()
        }

    def _cap(self, key: str) -> int:
        caps = self._caps
        if caps is None:
            return self.slots - self.reserved
        return caps.get(key, self.reserved)

    def waiting(self, key: str | None = None) -> int:
        """Requests waiting now (of `key`, or in all)."""
        if key is None:
            return self._waiting_total
        return sum(len(waiters.get(key, ())) for waiters in (self._waiting, self._lowest))

    def running_of(self, key: str) -> int:
        return self._running.get(key, 0)

    def virtual(self, key: str) -> float:
        """The key's virtual counter: weighted tokens served (for tests and debugging)."""
        return self._virtual.get(key, 0.0)

    def try_turn(self, key: str, *, cost: int, weight: float = 1.0, seats: int = 1) -> Turn | None:
        """`turn`'s answer when it is at once (slots free, nobody waiting), else None: the
        common case without a coroutine."""
        seats = max(1, seats)
        running = self._running.get(key)
        if (
            self._waiting_total
            or self.running + seats > self.slots
            or (running or 0) + seats > self._cap(key)
        ):
            return None
        if running is None:  # nothing waits: the key was idle
            self._activate(key)
        return self._start(key, weight, cost, seats, 0.0)

    async def turn(
        self,
        key: str,
        *,
        cost: int,
        weight: float = 1.0,
        seats: int = 1,
        gone: Callable[[], Awaitable[object]] | None = None,
    ) -> Turn:
        """Slots for one request of `key` that runs `seats` sequences (n, or a batch of
        prompts: each takes one of vLLM's max_num_seqs) and will cost about `cost` tokens:
        at once when they are free and nobody waits, else when the fair order says so.
        `gone` returns when the client disconnects. A request wider than a key's share
        (`per_key`) could never run: ValueError (the caller refuses it first)."""
        free = self.try_turn(key, cost=cost, weight=weight, seats=seats)
        if free is not None:
            return free
        seats = max(1, seats)
        if seats > self.per_key:
            raise ValueError(f"{seats} seats asked for; a key may hold {self.per_key}")
        self._activate(key)
        self._stats(key)  # its waiting count shows from now on
        now = self._clock()
        future = asyncio.get_running_loop().create_future()
        lowest = in_lowest_class()
        waiter = _Waiter(key, weight, cost, seats, now, future, lowest)
        (self._lowest if lowest else self._waiting).setdefault(key, deque()).append(waiter)
        self._waiting_total += 1
        self._dispatch()
        if not waiter.future.done():
            await self._wait(waiter, gone)
        return waiter.future.result()

    def release(self, turn: Turn, *, served: int | None = None) -> None:
        """The request ended; `served`, the tokens it was charged (None: its cost stands)."""
        if turn.released:
            return
        turn.released = True
        self.running -= turn.seats
        left = self._running[turn.key] - turn.seats
        if left:
            self._running[turn.key] = left
        else:
            del self._running[turn.key]
            del self._weights[turn.key]
        if served is not None:
            self._virtual[turn.key] += (served - turn.cost) / turn.weight
        self._dispatch()

    async def _wait(self, waiter: _Waiter, gone: Callable[[], Awaitable[object]] | None) -> None:
        watcher = asyncio.ensure_future(gone()) if gone is not None else None
        waits: set[asyncio.Future[object]] = {waiter.future}  # type: ignore[arg-type]
        if watcher is not None:
            waits.add(watcher)
        try:
            await asyncio.wait(waits, timeout=self.timeout_s, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            self._abandon(waiter)
            raise
        finally:
            if watcher is not None:
                watcher.cancel()
        if waiter.future.done() and not (watcher is not None and watcher.done()):
            return  # its turn came (even if the deadline passed in the same instant)
        self._abandon(waiter)
        stats = self._stats(waiter.key)
        if watcher is not None and watcher.done():
            stats.left += 1
            raise ClientGone
        stats.timeouts += 1
        raise QueueTimeout

    def _abandon(self, waiter: _Waiter) -> None:
        """Take a waiter out; if its turn had already come, give the slot back."""
        if waiter.future.done():
            if not waiter.future.cancelled():
                self.release(waiter.future.result(), served=0)
            return
        waiter.future.cancel()
        waiters = self._lowest if waiter.lowest else self._waiting
        queue = waiters[waiter.key]
        queue.remove(waiter)
        self._waiting_total -= 1
        if not queue:
            del waiters[waiter.key]

    def _activate(self, key: str) -> None:
        """A key that had nothing waiting or running starts no lower than the lowest
        active key: idle time earns no credit."""
        if key in self._running or key in self._waiting or key in self._lowest:
            return
        active = [self._virtual[k] for k in (*self._running, *self._waiting, *self._lowest)]
        if not active:  # a new busy period: what was served before it no longer counts
            self._virtual.clear()
            self._virtual[key] = 0.0
            return
        self._virtual[key] = max(self._virtual.get(key, 0.0), min(active))

    def _start(self, key: str, weight: float, cost: int, seats: int, waited_s: float) -> Turn:
        self.running += seats
        self._running[key] = self._running.get(key, 0) + seats
        self._weights[key] = weight
        self._virtual[key] = self._virtual.get(key, 0.0) + cost / weight
        self._stats(key).waited.observe(waited_s)
        return Turn(key, weight, cost, seats, waited_s)

    def _dispatch(self) -> None:
        while self._waiting_total and self.running < self.slots:
            free = self.slots - self.running
            waiters = self._waiting
            best, starved = self._best(waiters, free)
            if best is None and not starved:
                # The lowest class: no other waiter could take a free slot now (each is held
                # back by its own key's share, which only its key's ending requests free).
                waiters = self._lowest
                best, _ = self._best(waiters, free)
            if best is None:
                return  # no waiting key fits (its share is held, or too few slots are free)
            waiter = best.popleft()
            self._waiting_total -= 1
            if not best:
                del waiters[waiter.key]
            waited = self._clock() - waiter.since
            turn = self._start(waiter.key, waiter.weight, waiter.cost, waiter.seats, waited)
            waiter.future.set_result(turn)

    def _best(
        self, waiters: dict[str, deque[_Waiter]], free: int
    ) -> tuple[deque[_Waiter] | None, bool]:
        """The queue of `waiters` whose head goes next, and whether a head waits for more
        free slots than there are (the lowest class must not take them from it)."""
        best: deque[_Waiter] | None = None
        best_order = (0.0, 0, 0.0)
        starved = False
        for key, queue in waiters.items():
            running = self._running.get(key, 0)
            seats = queue[0].seats
            if running + seats > self._cap(key):
                continue
            if seats > free:
                starved = True
                continue
            # fewest weighted tokens; on a tie (a key just lifted to another's counter)
            # the key running fewer requests, then the oldest request
            order = (self._virtual[key], running, queue[0].since)
            if best is None or order < best_order:
                best, best_order = queue, order
        return best, starved

    def _stats(self, key: str) -> KeyQueueStats:
        stats = self.stats.get(key)
        if stats is None:
            stats = self.stats[key] = KeyQueueStats()
        return stats
