"""The shared quota store: counters in Redis, exact across gateway replicas.

    store = RedisQuotaStore.from_url("redis://redis:6379/0", timeout_s=0.25)
    lease, status = await store.try_reserve(scopes, prompt, max_tokens, ttl)

Every operation is one server-side Lua script (`redis_scripts`), sent with EVALSHA and
loaded again when the server answers NOSCRIPT (after a restart or SCRIPT FLUSH). A script
runs atomically, so replicas racing for a key's last slot or last requests of the minute
cannot both get it: one script is one step of the same state machine `InMemoryQuotaStore`
runs in-process. The scripts read Redis's own TIME, not the gateway's clock, so replicas
with skewed clocks still agree on buckets, days and expiries.

Layout (`lua/common.lua` has the details): per scope, 1 s buckets in a hash per minute
window and a hash with the requests in flight and the UTC day's and month's spending; per
key id, the leases in a hash and a sorted set by expiry, so the leases of a crashed replica
expire (the next reservation of that key, or any replica's upkeep, reclaims them with their
full reservation charged). Every key name is `<namespace>:{<key id>}:...`: the hash tag
puts all of a key id's counters in one cluster slot, and a request's scopes are always one
key id's. A set `<namespace>:keys` lists the key ids that have held leases, for upkeep.

The reserve script applies decision.decide's admit condition; on a refusal it hands back
the counters it read and `decide` itself names the refusal and its wait, so the two stores
refuse alike. Lease ids are made here (`LeaseIds`) and sent with the reservation: a
reservation whose answer was lost can be cancelled by id (`forget`), even before it lands.

Every call is bounded by `timeout_s`; one that fails or runs out raises
`QuotaStoreUnavailable` (redis-py's own retries are off: a script that may have run must
not run twice). Ending a lease is idempotent by id, so retrying one is always safe.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, NamedTuple
from urllib.parse import quote

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError

from serving.gateway.quota.decision import (
    Lease,
    LeaseState,
    MinuteUsage,
    RateLimitStatus,
    Refusal,
    ScopeState,
    decide,
    rate_limit_status,
)
from serving.gateway.quota.limits import Limits, Scope, ScopedLimits
from serving.gateway.quota.redis_scripts import SCRIPT_NAMES, ScriptName, script_source
from serving.gateway.quota.store import (
    InDoubt,
    LeaseIds,
    QuotaStoreUnavailable,
    ScopeUsage,
    check_ending,
)
from serving.gateway.quota.windows import Clock

DEFAULT_NAMESPACE = "qs"
DEFAULT_TIMEOUT_S = 0.25
# Expired leases one script call ends; upkeep calls again until fewer come back.
RECLAIM_BATCH = 64

_ENDINGS = {"expired": LeaseState.EXPIRED, "cancelled": LeaseState.FAILED}


class _Head(NamedTuple):
    """The clock and calendar a script ran at."""

    now: float
    wall: float
    bucket: int
    day: str
    month: str


class RedisQuotaStore:
    """`clock` is for tests that step time by hand; without it the scripts read Redis's
    TIME (both the window clock and the wall clock)."""

    def __init__(
        self,
        client: Redis,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        clock: Clock | None = None,
        namespace: str = DEFAULT_NAMESPACE,
    ) -> None:
        self._client = client
        self._timeout_s = timeout_s
        self._clock = clock
        self._namespace = namespace
        self._scripts: dict[ScriptName, AsyncScript] = {
            name: client.register_script(script_source(name)) for name in SCRIPT_NAMES
        }
        self._ids = LeaseIds()
        # Leases issued here and not seen ending: `active_leases`, and how reclaimed ones
        # are told that they expired.
        self._held: dict[str, Lease] = {}
        self._indexed: set[str] = set()

    @classmethod
    def from_url(
        cls, url: str, *, timeout_s: float = DEFAULT_TIMEOUT_S, clock: Clock | None = None
    ) -> RedisQuotaStore:
        client = Redis.from_url(
            url,
            decode_responses=True,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),
        )
        return cls(client, timeout_s=timeout_s, clock=clock)

    async def close(self) -> None:
        await self._client.aclose()

    async def ping(self) -> None:
        """Raise `QuotaStoreUnavailable` unless Redis answers within the time bound."""
        await self._bounded("ping", self._client.ping())

    # -- QuotaStore ---------------------------------------------------------------------

    async def try_reserve(
        self, scopes: Sequence[ScopedLimits], prompt_tokens: int, max_tokens: int, ttl: float
    ) -> tuple[Lease | Refusal, RateLimitStatus]:
        key_id = scopes[0].scope.key_id
        if key_id not in self._indexed:
            await self._bounded("index", self._client.sadd(self._index_key, key_id))
            self._indexed.add(key_id)
        lease_id = self._ids.next()
        args: list[str | int] = [*self._clock_args(), lease_id, repr(float(ttl))]
        args += [prompt_tokens, max_tokens]
        for scope, limits in scopes:
            args += [_scope_name(scope), *_limit_args(limits)]
        try:
            reply = await self._script("reserve", key_id, args)
        except QuotaStoreUnavailable as exc:
            # The script may have run and booked this id before its answer was lost.
            exc.in_doubt = InDoubt(lease_id, key_id)
            raise
        outcome, head, reclaimed = reply[0], _head(reply[1]), reply[2]
        self._expired(reclaimed)
        tokens = prompt_tokens + max_tokens
        if outcome == "refused":
            states = [_state(raw) for raw in reply[3:]]
            refusal = decide(scopes, states, tokens, head.now, head.wall)
            if refusal is None:
                raise RuntimeError("the reserve script refused what decision.decide admits")
            return refusal, rate_limit_status(scopes, states, head.now)
        if outcome != "admitted":
            raise RuntimeError(f"the reserve script answered {outcome!r} for a new lease id")
        after = [_booked(head.bucket, requests, tokens) for requests, tokens in reply[4:]]
        lease = Lease(
            lease_id=lease_id,
            scopes=tuple(scope for scope, _ in scopes),
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
        args: list[str | int] = [*self._clock_args(), lease.lease_id, charged_tokens, "0"]
        applied, ending = await self._script("finish", lease.key_id, args)
        self._held.pop(lease.lease_id, None)
        if applied:
            lease.state, lease.charged_tokens = state, charged_tokens
            return True
        _learn_ending(lease, ending)
        return False

    async def forget(self, in_doubt: InDoubt) -> None:
        """Settle a reservation whose answer was lost: if it was booked, end it charging no
        tokens; if it was not, make sure it never books anything. Idempotent."""
        args: list[str | int] = [*self._clock_args(), in_doubt.lease_id, 0, "1"]
        await self._script("finish", in_doubt.key_id, args)

    async def renew(self, lease: Lease, ttl: float) -> bool:
        args = [*self._clock_args(), lease.lease_id, repr(float(ttl))]
        renewed, detail = await self._script("renew", lease.key_id, args)
        if renewed:
            lease.expires_at = float(detail)
            return True
        self._held.pop(lease.lease_id, None)
        _learn_ending(lease, detail)
        return False

    async def reclaim_expired(self) -> int:
        key_ids = await self._bounded("index", self._client.smembers(self._index_key))
        reclaimed = 0
        for key_id in sorted(key_ids):
            while True:
                args: list[str | int] = [*self._clock_args(), RECLAIM_BATCH]
                ended = await self._script("reclaim", key_id, args)
                self._expired(ended)
                reclaimed += len(ended) // 2
                if len(ended) < 2 * RECLAIM_BATCH:
                    break
        return reclaimed

    def active_leases(self) -> int:
        return len(self._held)

    async def status(self, scopes: Sequence[ScopedLimits]) -> RateLimitStatus:
        head, states = await self._snapshot([scope for scope, _ in scopes])
        return rate_limit_status(scopes, states, head.now)

    async def usage(self, scope: Scope) -> ScopeUsage:
        _, (state,) = await self._snapshot([scope])
        return ScopeUsage(
            in_flight=state.in_flight,
            requests_in_window=state.requests.used,
            tokens_in_window=state.tokens.used,
            tokens_today=state.tokens_today,
            tokens_this_month=state.tokens_this_month,
        )

    # -- calling Redis ------------------------------------------------------------------

    @property
    def _index_key(self) -> str:
        return f"{self._namespace}:keys"

    def _clock_args(self) -> tuple[str, str]:
        if self._clock is None:
            return "", ""  # the scripts read Redis's TIME
        return repr(self._clock.monotonic()), repr(self._clock.wall())

    async def _snapshot(self, scopes: Sequence[Scope]) -> tuple[_Head, list[ScopeState]]:
        args = [*self._clock_args(), *(_scope_name(scope) for scope in scopes)]
        reply = await self._script("snapshot", scopes[0].key_id, args)
        return _head(reply[0]), [_state(raw) for raw in reply[1:]]

    async def _script(self, name: ScriptName, key_id: str, args: Sequence[str | int]) -> Any:
        leases = f"{self._namespace}:{{{quote(key_id, safe='')}}}:leases"
        return await self._bounded(name, self._scripts[name](keys=[leases], args=args))

    async def _bounded(self, what: str, call: Any) -> Any:
        try:
            async with asyncio.timeout(self._timeout_s):
                return await call
        except (RedisError, OSError, TimeoutError) as exc:
            raise QuotaStoreUnavailable(
                f"quota store: {what} failed ({type(exc).__name__})"
            ) from exc

    def _expired(self, flat: Sequence[Any]) -> None:
        """Tell the leases held here that a script reclaimed (`{id, charge, ...}`)."""
        for index in range(0, len(flat), 2):
            lease = self._held.pop(flat[index], None)
            if lease is not None:
                lease.state, lease.charged_tokens = LeaseState.EXPIRED, int(flat[index + 1])


def _scope_name(scope: Scope) -> str:
    # Model names may hold ':' or braces; quoted, they cannot clash with the layout.
    return "k" if scope.model is None else "m:" + quote(scope.model, safe="")


def _limit_args(limits: Limits) -> list[str]:
    values = (
        limits.max_concurrency,
        limits.rpm,
        limits.tpm,
        limits.tokens_per_day,
        limits.tokens_per_month,
    )
    return ["" if value is None else str(value) for value in values]


def _head(raw: Sequence[Any]) -> _Head:
    return _Head(float(raw[0]), float(raw[1]), int(raw[2]), str(raw[3]), str(raw[4]))


def _buckets(flat: Sequence[Any]) -> dict[int, int]:
    # Oldest first, as the script sorted them.
    return {int(flat[index]): int(flat[index + 1]) for index in range(0, len(flat), 2)}


def _state(raw: Sequence[Any]) -> ScopeState:
    in_flight, today, month, requests, request_buckets, tokens, token_buckets = raw
    return ScopeState(
        int(in_flight),
        MinuteUsage(int(requests), _buckets(request_buckets)),
        MinuteUsage(int(tokens), _buckets(token_buckets)),
        int(today),
        int(month),
    )


def _booked(bucket: int, requests: int, tokens: int) -> ScopeState:
    """A scope's minute windows right after an admission was booked in `bucket`: that is
    then the newest bucket holding something, which is all `window_reset` reads."""
    return ScopeState(
        0, MinuteUsage(requests, {bucket: requests}), MinuteUsage(tokens, {bucket: tokens}), 0, 0
    )


def _learn_ending(lease: Lease, ending: str | None) -> None:
    """Record on `lease` how it ended elsewhere, when Redis still knows."""
    if ending is None or not lease.active:
        return
    kind, _, tokens = ending.partition(":")
    lease.state, lease.charged_tokens = _ENDINGS[kind], int(tokens)
