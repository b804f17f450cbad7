"""The shared quota store: counters in Redis, exact across gateway replicas (docs/gateway.md,
shared quotas; the key layout is in `lua/common.lua`).

    store = RedisQuotaStore.from_url("redis://redis:6379/0", timeout_s=0.25)
    lease, status = await store.try_reserve(scopes, prompt, max_tokens, ttl)
    await store.finish(lease, LeaseState.SETTLED, charged)   # queued: no round trip
    await store.close()                                       # sends what is still queued

Rules:
- every operation is one atomic Lua script (`redis_scripts`) on Redis's own clock, the same
  state machine `InMemoryQuotaStore` runs; the reserve script applies `decision.decide`'s
  admit condition and hands back what it read, so `decide` names the refusal;
- `finish` sends nothing: the ending rides on the next script call (`settle_queue`), which
  ends queued leases first; it answers True for a lease this store issued and had not seen
  end (a lease another replica reclaimed meanwhile is told so once the ending arrives);
- lease ids are made here (`LeaseIds`), so a reservation whose answer was lost is cancelled
  by id instead of holding its slot until it expires;
- key names carry a hash tag per key id, but one script may end several key ids' leases:
  one Redis, not a Redis Cluster;
- every call is bounded by `timeout_s` and raises `QuotaStoreUnavailable`; nothing is
  retried, since a script that may have run must not run twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from serving.gateway.quota.decision import (
    Lease,
    LeaseState,
    RateLimitStatus,
    Refusal,
    ScopeState,
    decide,
    rate_limit_status,
)
from serving.gateway.quota.limits import Scope, ScopedLimits
from serving.gateway.quota.redis_client import Arg, RedisClient
from serving.gateway.quota.redis_codec import (
    Head,
    booked,
    learn_ending,
    limit_args,
    read_head,
    read_state,
    scope_name,
)
from serving.gateway.quota.redis_connection import RedisConnectError, RedisError
from serving.gateway.quota.redis_scripts import ScriptName, lua_script
from serving.gateway.quota.settle_queue import Ending, SettleQueue
from serving.gateway.quota.store import (
    InDoubt,
    LeaseIds,
    QuotaStoreUnavailable,
    ScopeUsage,
    check_ending,
    check_reservation,
)
from serving.gateway.quota.windows import Clock

logger = logging.getLogger(__name__)

DEFAULT_NAMESPACE = "qs"
DEFAULT_TIMEOUT_S = 0.25
DEFAULT_SETTLE_DELAY_S = 0.005
# After a failed call, its endings wait this long before they are sent by themselves again.
SETTLE_RETRY_S = 1.0
# Endings one call carries: bounds one script's run (each ending is a few commands).
MAX_ENDINGS_PER_CALL = 256
# Expired leases one script call ends per key id; upkeep calls again until fewer come back.
RECLAIM_BATCH = 64
# Key ids one reclaim call covers; the calls for more go out together (pipelined).
RECLAIM_KEYS_PER_CALL = 64


class RedisQuotaStore:
    """`clock` is for tests that step time by hand; without it the scripts read Redis's
    TIME (both the window clock and the wall clock)."""

    def __init__(
        self,
        client: RedisClient,
        *,
        clock: Clock | None = None,
        namespace: str = DEFAULT_NAMESPACE,
        settle_delay_s: float = DEFAULT_SETTLE_DELAY_S,
    ) -> None:
        self._client = client
        self._clock = clock
        self._namespace = namespace
        self._index_key = f"{namespace}:keys"
        self._ids = LeaseIds()
        # Leases issued here whose ending Redis has not confirmed: `active_leases` (queued
        # endings included: their slots are still held in Redis), and how reclaimed ones
        # are told that they expired.
        self._held: dict[str, Lease] = {}
        self._lease_keys: dict[str, str] = {}
        self._queue = SettleQueue(delay_s=settle_delay_s, retry_s=SETTLE_RETRY_S, due=self._due)
        self._flushing: asyncio.Future[None] | None = None
        self._closed = False

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        clock: Clock | None = None,
        settle_delay_s: float = DEFAULT_SETTLE_DELAY_S,
    ) -> RedisQuotaStore:
        client = RedisClient.from_url(url, timeout_s=timeout_s)
        return cls(client, clock=clock, settle_delay_s=settle_delay_s)

    async def close(self) -> None:
        """Send the endings still queued (if Redis answers in time), then disconnect."""
        if self._flushing is not None and not self._flushing.done():
            await asyncio.wait([self._flushing])
        try:
            await self.flush()
        except QuotaStoreUnavailable as exc:
            logger.warning(
                "%s at shutdown: %d lease endings are lost; those leases expire with their "
                "whole reservation charged",
                exc,
                len(self._queue),
            )
        self._closed = True
        self._queue.close()
        await self._client.close()

    async def ping(self) -> None:
        """Raise `QuotaStoreUnavailable` unless Redis answers within the time bound."""
        await self._call("PING")

    async def flush(self) -> None:
        """Send the queued endings now. Raises `QuotaStoreUnavailable` if Redis does not
        take them (they stay queued)."""
        while self._queue.waiting():
            await self._run("settle", (), ())

    def pending(self) -> int:
        """Endings queued or on their way (their leases still hold their slots in Redis)."""
        return len(self._queue)

    # -- QuotaStore ---------------------------------------------------------------------

    async def try_reserve(
        self, scopes: Sequence[ScopedLimits], prompt_tokens: int, max_tokens: int, ttl: float
    ) -> tuple[Lease | Refusal, RateLimitStatus]:
        check_reservation(prompt_tokens, max_tokens, ttl)
        key_id = scopes[0].scope.key_id
        lease_id = self._ids.next()
        # Sent every time (SADD is idempotent and O(1)): a Redis that restarted empty lost the
        # index, and a replica remembering what it once added would never add it again.
        args: list[Arg] = [
            lease_id,
            repr(float(ttl)),
            prompt_tokens,
            max_tokens,
            self._index_key,
            key_id,
        ]
        for scope, limits in scopes:
            args += [scope_name(scope), *limit_args(limits)]
        try:
            reply = await self._run("reserve", (self._leases_key(key_id),), args)
        except QuotaStoreUnavailable as exc:
            if not isinstance(exc.__cause__, RedisConnectError):
                # It was sent: it may have booked this id before its answer was lost.
                exc.in_doubt = self.forget(InDoubt(lease_id, key_id))
            raise
        except asyncio.CancelledError:
            # Shutdown (or a bug) cut it off: give the reservation up rather than let it
            # hold a slot until it expires.
            self.forget(InDoubt(lease_id, key_id))
            raise
        outcome, head, reclaimed = reply[0], read_head(reply[1]), reply[2]
        self._expired(reclaimed)
        tokens = prompt_tokens + max_tokens
        if outcome == "refused":
            states = [read_state(raw) for raw in reply[3:]]
            refusal = decide(scopes, states, tokens, head.now, head.wall)
            if refusal is None:
                raise RuntimeError("the reserve script refused what decision.decide admits")
            return refusal, rate_limit_status(scopes, states, head.now)
        if outcome != "admitted":
            raise RuntimeError(f"the reserve script answered {outcome!r} for a new lease id")
        after = [booked(head.bucket, requests, tokens) for requests, tokens in reply[4:]]
        lease = Lease(
            lease_id=lease_id,
            scopes=tuple([scope for scope, _ in scopes]),  # a list: cheaper than a generator here
            prompt_estimate=prompt_tokens,
            max_tokens=max_tokens,
            bucket=head.bucket,
            day=head.day,
            month=head.month,
            expires_at=float(reply[3]),
        )
        self._held[lease_id] = lease
        return lease, rate_limit_status(scopes, after, head.now)

    async def finish(self, lease: Lease, state: LeaseState, charged_tokens: int) -> bool:
        check_ending(state)
        lease_id = lease.lease_id
        withdraw = state is LeaseState.WITHDRAWN
        if lease_id in self._queue:
            return False  # ended here already; the ending is on its way
        issued = self._held.get(lease_id)
        if issued is None:
            # Not issued here, or already seen ending: only Redis knows. Ask it now.
            ending = Ending(lease_id, lease.key_id, charged_tokens, False, lease, withdraw)
            if not await self._run("settle", (), (), also=ending):
                return False
        else:
            self._queue.put(Ending(lease_id, lease.key_id, charged_tokens, False, issued, withdraw))
            issued.state, issued.charged_tokens = state, charged_tokens
        lease.state, lease.charged_tokens = state, charged_tokens
        return True

    def forget(self, in_doubt: InDoubt) -> InDoubt:
        """Give up a reservation whose answer was lost: if it was booked, end it charging no
        tokens; if it was not, make sure it never books anything. Queued like an ending."""
        self._queue.put(Ending(in_doubt.lease_id, in_doubt.key_id, 0, True, None))
        return in_doubt

    async def renew(self, lease: Lease, ttl: float) -> bool:
        lease_id = lease.lease_id
        if lease_id in self._queue:
            return False
        args = [lease_id, repr(float(ttl))]
        renewed, detail = await self._run("renew", (self._leases_key(lease.key_id),), args)
        if renewed:
            lease.expires_at = float(detail)
            return True
        self._held.pop(lease_id, None)
        if lease.active:
            learn_ending(lease, detail)
        return False

    async def reclaim_expired(self) -> int:
        key_ids = sorted(await self._call("SMEMBERS", self._index_key))
        reclaimed = 0
        while key_ids:
            chunks = [
                key_ids[start : start + RECLAIM_KEYS_PER_CALL]
                for start in range(0, len(key_ids), RECLAIM_KEYS_PER_CALL)
            ]
            replies = await asyncio.gather(
                *(
                    self._run(
                        "reclaim", [self._leases_key(key_id) for key_id in chunk], [RECLAIM_BATCH]
                    )
                    for chunk in chunks
                )
            )
            key_ids = []
            for chunk, reply in zip(chunks, replies, strict=True):
                for key_id, ended in zip(chunk, reply, strict=True):
                    self._expired(ended)
                    reclaimed += len(ended) // 2
                    if len(ended) >= 2 * RECLAIM_BATCH:
                        key_ids.append(key_id)  # there may be more
        return reclaimed

    def active_leases(self) -> int:
        return len(self._held)

    async def status(self, scopes: Sequence[ScopedLimits]) -> RateLimitStatus:
        head, states = await self._snapshot([scope for scope, _ in scopes])
        return rate_limit_status(scopes, states, head.now)

    async def usage(self, scope: Scope) -> ScopeUsage:
        _, (state,) = await self._snapshot([scope])
        return ScopeUsage.of(state)

    # -- calling Redis ------------------------------------------------------------------

    def _leases_key(self, key_id: str) -> str:
        name = self._lease_keys.get(key_id)
        if name is None:
            name = f"{self._namespace}:{{{quote(key_id, safe='')}}}:leases"
            self._lease_keys[key_id] = name
        return name

    def _clock_args(self) -> tuple[str, str]:
        if self._clock is None:
            return "", ""  # the scripts read Redis's TIME
        return repr(self._clock.monotonic()), repr(self._clock.wall())

    async def _snapshot(self, scopes: Sequence[Scope]) -> tuple[Head, list[ScopeState]]:
        names = [scope_name(scope) for scope in scopes]
        reply = await self._run("snapshot", (self._leases_key(scopes[0].key_id),), names)
        return read_head(reply[0]), [read_state(raw) for raw in reply[1:]]

    async def _run(
        self,
        name: ScriptName,
        own_keys: Sequence[str],
        args: Sequence[Arg],
        *,
        also: Ending | None = None,
    ) -> Any:
        """Run script `name` carrying the queued endings (and `also`, ended at once; then
        the answer is whether `also` ended in this call), which end before it runs."""
        queued = self._queue.take(MAX_ENDINGS_PER_CALL)
        batch = [*queued, also] if also is not None else queued
        keys = [self._leases_key(ending.key_id) for ending in batch]
        keys += own_keys
        argv: list[Arg] = [*self._clock_args(), len(batch)]
        for ending in batch:
            argv += (ending.lease_id, ending.charge, _mode(ending))
        argv += args
        try:
            already, reply = await self._client.run_script(lua_script(name), keys, argv)
        except RedisError as exc:
            self._queue.returned(queued)
            raise QuotaStoreUnavailable(
                f"quota store: {name} failed ({type(exc).__name__}: {exc})"
            ) from exc
        except asyncio.CancelledError:
            self._queue.returned(queued)
            raise
        self._queue.delivered(queued)
        held = self._held
        for ending in queued:
            held.pop(ending.lease_id, None)
        ended_before = False
        for index in range(0, len(already), 2):
            ending = batch[already[index] - 1]
            if ending is also:
                ended_before = True
            if ending.lease is not None and already[index + 1] is not None:
                # It had expired (or been given up) before its ending arrived: say so.
                learn_ending(ending.lease, already[index + 1])
        return not ended_before if also is not None else reply

    async def _call(self, command: str, *args: Arg) -> Any:
        try:
            return await self._client.call(command, *args)
        except RedisError as exc:
            raise QuotaStoreUnavailable(
                f"quota store: {command} failed ({type(exc).__name__}: {exc})"
            ) from exc

    def _due(self) -> None:
        """The queue's timer: endings waited long enough for a call; send them alone."""
        if self._closed:
            return  # closed, the client refuses calls: nothing more to try
        if self._flushing is None or self._flushing.done():
            self._flushing = asyncio.ensure_future(self._flush_quietly())

    async def _flush_quietly(self) -> None:
        with contextlib.suppress(QuotaStoreUnavailable):
            # They stay queued: the next call, the upkeep's flush or the retry takes them.
            await self.flush()

    def _expired(self, flat: Sequence[Any]) -> None:
        """Tell the leases held here that a script reclaimed (`{id, charge, ...}`)."""
        for index in range(0, len(flat), 2):
            lease = self._held.pop(flat[index], None)
            if lease is not None:
                lease.state, lease.charged_tokens = LeaseState.EXPIRED, int(flat[index + 1])


def _mode(ending: Ending) -> str:
    """How the prelude of common.lua ends it: '1' cancel a lost reservation, '2' withdraw
    (the request leaves requests/min too), '0' an ordinary ending."""
    return "1" if ending.cancel else "2" if ending.withdraw else "0"
