"""Where quota state lives, as a few atomic operations.

Each call checks and changes everything it touches in one step, so a store can be an
in-process object on one event loop (`InMemoryQuotaStore`) or, later, a Redis script run per
call, without the engine above changing. The in-memory store is synchronous on purpose:
a call cannot be interleaved with another coroutine, so no locks are needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

from serving.gateway.quota.admission import Refusal
from serving.gateway.quota.headers import RateLimitStatus
from serving.gateway.quota.lease import Lease, LeaseState
from serving.gateway.quota.limits import Scope, ScopedLimits


class ScopeUsage(NamedTuple):
    """What one scope holds now (reservations of in-flight requests included)."""

    in_flight: int
    requests_in_window: int
    tokens_in_window: int
    tokens_today: int
    tokens_this_month: int


class QuotaStore(Protocol):
    def try_reserve(
        self, scopes: Sequence[ScopedLimits], prompt_tokens: int, max_tokens: int, ttl: float
    ) -> Lease | Refusal:
        """All or nothing: if every limit of every scope admits one more request holding
        `prompt_tokens + max_tokens` tokens and a slot, book all of it and return the lease;
        otherwise change nothing and return the refusal with the longest wait."""
        ...

    def finish(self, lease: Lease, state: LeaseState, charged_tokens: int) -> bool:
        """End an active lease: free its slot, replace its reservation by `charged_tokens`.
        False (and nothing changes) if the lease had already ended or expired."""
        ...

    def renew(self, lease: Lease, ttl: float) -> bool:
        """Push an active lease's expiry to now + ttl (long streams); False if it ended."""
        ...

    def reclaim_expired(self) -> int:
        """End leases past their expiry, keeping their full reservation charged."""
        ...

    def active_leases(self) -> int:
        """Leases issued and not yet ended (0 when no request is running)."""
        ...

    def status(self, scopes: Sequence[ScopedLimits]) -> RateLimitStatus: ...

    def usage(self, scope: Scope) -> ScopeUsage: ...

    def flush(self) -> None:
        """Persist what must survive a restart (no-op for stores without persistence)."""
        ...
