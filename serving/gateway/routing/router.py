"""Which vLLM engine a request goes to, over the engines behind one gateway (docs/scale-out.md,
routing over engines).

    router = Router(engines, policy="affinity", overload=8)
    engine = router.choose(prefix_hashes)          # None: no engine in rotation (503 at once)
    other = router.choose(prefix_hashes, exclude=engine)   # a failover target, or None
    router.connect_failed(engine)                  # out of the rotation until a probe passes
    router.probed(engine, reason)                  # the health monitor's verdict
    router.add(engine); router.drain(engine)       # engine discovery (`discovery`)
    router.on_rotation(callback)                   # callback(engines in rotation) on change

Rules:
- an engine is in the rotation while its last `/health` probe passed (or probes and connects
  to it timed out fewer than `TIMEOUTS_TO_LEAVE` times in a row: a busy vLLM answers slowly)
  and no connect to it was refused since; back in, its prefix memory is dropped (a restarted
  engine's cache is empty);
- policies: `least-loaded` (ties in turn), `round-robin`, `affinity` (the engine that served
  the longest prefix, unless it has `overload` more in flight than the least-loaded one);
- a drained engine leaves the rotation at once and its connections close when its last
  request has (`reap`); its counters are then added to `retired`;
- `on_rotation` reports the rotation's size, which the fair queue's slots follow;
- load counts and the prefix table are per replica: routing costs no network call.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from typing import Literal

from serving.gateway.routing.prefix_affinity import PrefixTable
from serving.gateway.upstream import UpstreamClient

logger = logging.getLogger(__name__)
Policy = Literal["affinity", "least-loaded", "round-robin"]
CONNECT_FAILED = "connecting failed"
NOT_CHECKED = "upstream not checked yet"
DRAINING = "draining: no longer discovered"
# Engine ids: the prefix table's name for an engine, never reused in a process (an engine
# that comes back at the same address is a new engine: its prefix cache is empty).
_ids = itertools.count()
# Health probes and connects in a row that must time out before an engine in the rotation
# leaves it.
TIMEOUTS_TO_LEAVE = 3


class Engine:
    """One vLLM replica: its client and what this gateway knows of it."""

    __slots__ = (
        "accounted_tokens",
        "client",
        "cut_sequences",
        "failovers",
        "in_flight",
        "index",
        "label",
        "reason",
        "requests",
        "timeouts",
    )

    def __init__(self, client: UpstreamClient) -> None:
        self.index = next(_ids)
        self.label = client.address
        """The metric label: the engine's host:port (stable while engines come and go)."""
        self.client = client
        self.reason: str | None = NOT_CHECKED
        """Why it is out of the rotation; None while it is in."""
        self.in_flight = 0
        self.requests = 0
        """Requests sent to it (failover attempts included)."""
        self.failovers = 0
        """Requests that failed on it before a response and were sent to another engine."""
        self.accounted_tokens = 0
        """Tokens charged to keys for the metered requests it served, a prompt counted once
        per sequence run on it (as vLLM's own counters count it): what its prompt and
        generation counters must not exceed (the accounting oracle)."""
        self.cut_sequences = 0
        """Sequences (n x prompts) of those requests charged by a bound (no final usage: cut,
        aborted, failed): vLLM may have worked on each a moment after the gateway's last
        read."""
        self.timeouts = 0
        """Health probes in a row that got no answer in time."""

    @property
    def in_rotation(self) -> bool:
        return self.reason is None

    @property
    def draining(self) -> bool:
        return self.reason is DRAINING


class Retired:
    """The counters of the engines this gateway forgot (drained, then reaped), summed. The
    metrics export them as one engine, `RETIRED`: a sum over engines never goes down (the
    accounting oracle and `increase(sum(...))` rely on it), and a fleet whose pods come and
    go does not leave a series per address forever."""

    __slots__ = ("accounted_tokens", "cut_sequences", "failovers", "requests")

    def __init__(self) -> None:
        self.requests = 0
        self.failovers = 0
        self.accounted_tokens = 0
        self.cut_sequences = 0

    def add(self, engine: Engine) -> None:
        self.requests += engine.requests
        self.failovers += engine.failovers
        self.accounted_tokens += engine.accounted_tokens
        self.cut_sequences += engine.cut_sequences


class Router:
    def __init__(self, engines: Sequence[Engine], *, policy: Policy, overload: int) -> None:
        self.engines = tuple(engines)
        """The engines requests may go to (draining ones are no longer here)."""
        self.draining: tuple[Engine, ...] = ()
        """Engines left out of the rotation for good, serving their last requests."""
        self.retired = Retired()
        self.policy = policy
        self._overload = overload
        self._next = 0
        self._prefixes = PrefixTable()
        self._rotation_watch: Callable[[int], None] | None = None
        self._in_rotation = 0

    @property
    def wants_prefixes(self) -> bool:
        """Whether `choose` uses prompt prefixes (only worth computing then)."""
        return self.policy == "affinity" and len(self.engines) > 1

    def choose(
        self,
        prefixes: Sequence[int] = (),
        exclude: Engine | None = None,
        among: frozenset[int] | None = None,
    ) -> Engine | None:
        """The engine for a request; None when no engine (other than `exclude`, and with
        `among`, whose id is in it: the engines serving the request's model) is in the
        rotation."""
        engines = self.engines
        if len(engines) == 1:
            only = engines[0]
            usable = only.reason is None and only is not exclude
            return only if usable and (among is None or only.index in among) else None
        eligible = [
            engine.reason is None
            and engine is not exclude
            and (among is None or engine.index in among)
            for engine in engines
        ]
        if self.policy == "round-robin":
            return self._in_turn(eligible)
        least = self._least_loaded(eligible)
        if least is None or not prefixes or self.policy != "affinity":
            return least
        by_id = {engine.index: engine for engine, ok in zip(engines, eligible, strict=True) if ok}
        held = self._prefixes.longest_match(prefixes, by_id)
        chosen = least
        if held is not None and by_id[held].in_flight <= least.in_flight + self._overload:
            chosen = by_id[held]
        self._prefixes.remember(prefixes, chosen.index)
        return chosen

    def add(self, engine: Engine) -> None:
        """A discovered engine: it joins the rotation once a probe passes (`probed`)."""
        self.engines = (*self.engines, engine)

    def drain(self, engine: Engine) -> None:
        """An engine no longer discovered: no new request goes to it from now on; the ones
        it is serving finish (`reap` says when its client may close)."""
        _set_reason(engine, DRAINING)
        self.engines = tuple(other for other in self.engines if other is not engine)
        self.draining = (*self.draining, engine)
        self._prefixes.forget_engine(engine.index)
        self._count_rotation()

    def reap(self) -> list[Engine]:
        """The drained engines that have finished their last request (now forgotten)."""
        done = [engine for engine in self.draining if engine.in_flight == 0]
        if done:
            self.draining = tuple(engine for engine in self.draining if engine.in_flight)
        for engine in done:
            self.retired.add(engine)
        return done

    def connect_failed(self, engine: Engine, detail: str = "", *, timed_out: bool = False) -> None:
        """A connect to `engine` failed: refused or unreachable takes it out at once; one that
        timed out counts as a probe that timed out (a starved host accepts late, and taking
        the only engine out would turn one slow connect into a 503 for everyone)."""
        if timed_out and _rides_out_a_timeout(engine):
            logger.warning("engine %s: %s (%d in a row)", engine.label, detail, engine.timeouts)
            return
        _set_reason(engine, CONNECT_FAILED, detail)
        self._count_rotation()

    def probed(self, engine: Engine, reason: str | None, *, timed_out: bool = False) -> None:
        """The health monitor's verdict on `engine` (None: healthy). A probe that got no
        answer in time takes an engine out only on the `TIMEOUTS_TO_LEAVE`th in a row: vLLM
        answers `/health` after its engine core, so a busy engine is slow to answer, and
        one slow probe must not take a working engine (or the only one) out. A drained
        engine stays out (a probe sent before it was drained may answer after)."""
        if engine.reason is DRAINING:
            return
        if timed_out:
            if _rides_out_a_timeout(engine):
                return
        else:
            engine.timeouts = 0
        if reason is None and engine.reason is not None:
            self._prefixes.forget_engine(engine.index)
        _set_reason(engine, reason)
        self._count_rotation()

    def on_rotation(self, callback: Callable[[int], None]) -> None:
        """`callback(engines in rotation)` now, and from now on whenever that number changes."""
        self._rotation_watch = callback
        self._in_rotation = sum(engine.reason is None for engine in self.engines)
        callback(self._in_rotation)

    def _count_rotation(self) -> None:
        if self._rotation_watch is None:
            return
        count = sum(engine.reason is None for engine in self.engines)
        if count != self._in_rotation:
            self._in_rotation = count
            self._rotation_watch(count)

    @property
    def unready_reason(self) -> str | None:
        """None while any engine is in the rotation, else why none is."""
        if any(engine.reason is None for engine in self.engines):
            return None
        if not self.engines:
            return "no engine: discovery found none"
        if len(self.engines) == 1:
            return self.engines[0].reason
        # Positions, not addresses: /readyz answers anyone, and must not map the network.
        return "no engine in rotation: " + "; ".join(
            f"engine {position}: {engine.reason}" for position, engine in enumerate(self.engines)
        )

    def gateway_location(self, location: bytes) -> bytes:
        """A redirect target as the client may see it: relative when it points at any engine."""
        for engine in self.engines:
            relative = engine.client.gateway_location(location)
            if relative != location:
                return relative
        return location

    def _in_turn(self, eligible: list[bool]) -> Engine | None:
        count = len(self.engines)
        for step in range(count):
            index = (self._next + step) % count
            if eligible[index]:
                self._next = index + 1
                return self.engines[index]
        return None

    def _least_loaded(self, eligible: list[bool]) -> Engine | None:
        engines = self.engines
        count = len(engines)
        best: Engine | None = None
        best_index = 0
        start = self._next
        for step in range(count):
            index = (start + step) % count
            engine = engines[index]
            if eligible[index] and (best is None or engine.in_flight < best.in_flight):
                best = engine
                best_index = index
        if best is not None:
            self._next = best_index + 1
        return best


def _rides_out_a_timeout(engine: Engine) -> bool:
    """Count one more probe or connect that timed out; True while an engine in the rotation
    stays in (fewer than `TIMEOUTS_TO_LEAVE` in a row)."""
    engine.timeouts += 1
    return engine.reason is None and engine.timeouts < TIMEOUTS_TO_LEAVE


def _set_reason(engine: Engine, reason: str | None, detail: str = "") -> None:
    """Every move in or out of the rotation goes through here, so the log tells an operator
    why a gateway answered 503 (`detail` is for the log only: /readyz shows `reason`)."""
    before, engine.reason = engine.reason, reason
    if before is None and reason is not None:
        why = f"{reason} ({detail})" if detail else reason
        logger.warning("engine %s left the rotation: %s", engine.label, why)
    elif before is not None and before is not NOT_CHECKED and reason is None:
        logger.info("engine %s is back in the rotation", engine.label)
    elif before is NOT_CHECKED and reason is not None:
        logger.warning("engine %s is not in the rotation: %s", engine.label, reason)
