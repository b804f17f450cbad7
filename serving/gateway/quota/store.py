"""Where quota state lives: the `QuotaStore` interface, a few atomic async operations
(docs/gateway.md, limits and shared quotas).

Rules:
- each call checks and changes everything it touches in one step, so a store can be an
  in-process object (`memory_store.InMemoryQuotaStore`) or one script per call on a shared
  server (`redis_store.RedisQuotaStore`); one call reserves and reports the rate-limit state,
  so admission costs one round trip;
- ending a lease is idempotent by its id: the first `finish` books its charge and says True,
  every later one changes nothing and says False; a shared store may deliver an ending with
  its next call, and a lease found ended otherwise meanwhile (expired) is told so on its object;
- a lease nobody ends or renews expires with its whole reservation charged
  (`reclaim_expired`): a crashed gateway holds no slot forever and never under-charges;
- a store that cannot answer raises `QuotaStoreUnavailable`; what then happens is
  `failure_policy`'s business.
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Sequence
from typing import NamedTuple, Protocol

from serving.gateway.failures import GatewayException
from serving.gateway.quota.decision import (
    Lease,
    LeaseState,
    RateLimitStatus,
    Refusal,
    ScopeState,
)
from serving.gateway.quota.limits import Scope, ScopedLimits

# The largest reservation a store books: every counter stays an exact integer in each store
# (Python's ints, Redis's 64-bit counters and the doubles of its Lua scripts, exact to 2**53).
MAX_RESERVATION = 1 << 50
_INF = float("inf")


def check_reservation(prompt_tokens: object, max_tokens: object, ttl: object) -> None:
    """ValueError, before a store touches anything, for a reservation no counter can hold:
    negative, not an integer, past `MAX_RESERVATION`, or a ttl that is not a positive time.
    The gateway bounds what it asks for (`openai_request`), so this only ever fires on a
    bug; every store calls it first, so none of them half-applies one."""
    if (  # what the gateway sends, checked in one expression (this runs for every request)
        type(prompt_tokens) is int
        and type(max_tokens) is int
        and prompt_tokens >= 0
        and max_tokens >= 0
        and prompt_tokens + max_tokens <= MAX_RESERVATION
        and (type(ttl) is float or type(ttl) is int)
        and 0 < ttl < _INF
    ):
        return
    for name, value in (("prompt_tokens", prompt_tokens), ("max_tokens", max_tokens)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    assert isinstance(prompt_tokens, int) and isinstance(max_tokens, int)
    if prompt_tokens + max_tokens > MAX_RESERVATION:
        raise ValueError(f"a reservation of {prompt_tokens + max_tokens} tokens is too large")
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl < float("inf"):
        raise ValueError(f"ttl must be a positive number of seconds, got {ttl!r}")


class ScopeUsage(NamedTuple):
    """What one scope holds now (reservations of in-flight requests included)."""

    in_flight: int
    requests_in_window: int
    tokens_in_window: int
    tokens_today: int
    tokens_this_month: int

    @classmethod
    def of(cls, state: ScopeState) -> ScopeUsage:
        """The usage a store reports from the state it decides on (every store's `usage`)."""
        return cls(
            in_flight=state.in_flight,
            requests_in_window=state.requests.used,
            tokens_in_window=state.tokens.used,
            tokens_today=state.tokens_today,
            tokens_this_month=state.tokens_this_month,
        )


class InDoubt(NamedTuple):
    """A reservation sent to a shared store whose answer was lost: it may or may not have
    been booked under this lease id."""

    lease_id: str
    key_id: str


class QuotaStoreUnavailable(GatewayException):
    """The store could not answer in time. `in_doubt`: set when a reservation may have been
    booked all the same (the caller settles it once the store answers again)."""

    def __init__(self, message: str, *, in_doubt: InDoubt | None = None) -> None:
        super().__init__(message)
        self.in_doubt = in_doubt


class QuotaStore(Protocol):
    async def try_reserve(
        self, scopes: Sequence[ScopedLimits], prompt_tokens: int, max_tokens: int, ttl: float
    ) -> tuple[Lease | Refusal, RateLimitStatus]:
        """All or nothing: if every limit of every scope admits one more request holding
        `prompt_tokens + max_tokens` tokens and a slot, book all of it and return the lease
        (expiring `ttl` seconds from now); otherwise change nothing and return the refusal
        with the longest wait. Either way with the rate-limit state as it is after the call
        (what `status` would say), so one call reserves and reports."""
        ...

    async def finish(self, lease: Lease, state: LeaseState, charged_tokens: int) -> bool:
        """End the lease with this id: free its slot, replace its reservation by
        `charged_tokens`; a `WITHDRAWN` ending also takes the request out of requests/min.
        False (and nothing changes) if it had already ended or expired, as far as this store
        knows (see the module docstring)."""
        ...

    async def renew(self, lease: Lease, ttl: float) -> bool:
        """Push an active lease's expiry to now + ttl (long streams); False if it ended."""
        ...

    async def reclaim_expired(self) -> int:
        """End leases past their expiry, keeping their full reservation charged."""
        ...

    async def status(self, scopes: Sequence[ScopedLimits]) -> RateLimitStatus: ...

    async def usage(self, scope: Scope) -> ScopeUsage: ...

    def active_leases(self) -> int:
        """Leases this store object issued and has not seen end (0 when none of this
        process's requests is running). Local knowledge, so synchronous: a metrics scrape
        reads it."""
        ...


def check_ending(state: LeaseState) -> None:
    if state in (LeaseState.ACTIVE, LeaseState.EXPIRED):
        raise ValueError(f"finish() ends a lease; {state} is not an ending")


class LeaseIds:
    """Lease ids unique across stores, processes and replicas without asking anyone: a random
    prefix per store object and a counter (cheaper than a uuid4 per request)."""

    __slots__ = ("_counter", "_prefix")

    def __init__(self) -> None:
        self._prefix = secrets.token_hex(8) + "-"
        self._counter = itertools.count(1)

    def next(self) -> str:
        return f"{self._prefix}{next(self._counter)}"
