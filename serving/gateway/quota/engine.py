"""Reserve, then settle (docs/architecture.md, quota semantics), on top of any `QuotaStore`.

    admission = await engine.admit(key, model, prompt_estimate, requested_max_tokens,
                                   context_window=window, choices=n)
    if isinstance(admission, Refusal): answer 429
    send upstream with max_tokens=admission.max_tokens, then exactly one of:
        await engine.settle(lease, usage...)   response complete
        await engine.abort(lease, seen...)     client went away mid-way
        await engine.fail(lease)               upstream failed before producing anything
    or, before anything was sent upstream:
        await engine.withdraw(lease)           a check after admission refused the body

Rules:
- "never over a limit" holds while the reservation (`prompt_estimate + max_tokens`) bounds
  the charge: the caller estimates the prompt from above; a charge above it is still booked;
- `fail` charges no tokens but the request still counts against requests/min (it loaded the
  upstream; refunding it would let a failing upstream be hammered past rpm);
- `withdraw` consumes nothing, requests/min included: nothing reached the upstream.
"""

from __future__ import annotations

import math
from dataclasses import replace

from serving.gateway.failures import GatewayException
from serving.gateway.quota.decision import (
    CONCURRENCY_RETRY_SECONDS,
    Admission,
    Lease,
    LeaseState,
    RateLimitStatus,
    Refusal,
    RefusalReason,
)
from serving.gateway.quota.limits import QuotaSubject, Scope, ScopedLimits, scoped_limits
from serving.gateway.quota.store import QuotaStore

DEFAULT_MAX_TOKENS = 4096
# In-process, a lease outlives its request only through a bug; streams longer than this
# must be renewed (`renew`) or they lose their slot and their key may exceed concurrency.
DEFAULT_LEASE_TTL = 600.0


class BeyondContext(GatewayException, ValueError):
    """A client's max_tokens (after its key's cap) that the model's context can never hold."""

    def __init__(self, requested: int, context_window: int) -> None:
        super().__init__(f"max_tokens {requested} exceeds the context window {context_window}")
        self.requested = requested
        self.context_window = context_window


class QuotaEngine:
    """Usage: `QuotaEngine(InMemoryQuotaStore(), default_max_tokens=2048)`."""

    def __init__(
        self,
        store: QuotaStore,
        *,
        default_max_tokens: int = DEFAULT_MAX_TOKENS,
        lease_ttl: float = DEFAULT_LEASE_TTL,
    ) -> None:
        if default_max_tokens < 1:
            raise ValueError(f"default_max_tokens must be at least 1, got {default_max_tokens}")
        self.store = store
        self._default_max_tokens = default_max_tokens
        self._lease_ttl = lease_ttl

    async def admit(
        self,
        key: QuotaSubject,
        model: str,
        prompt_tokens_estimate: int,
        requested_max_tokens: int | None,
        *,
        context_window: int | None = None,
        choices: int = 1,
        longest_prompt_estimate: int | None = None,
    ) -> Admission | Refusal:
        """Reserve for one request of `key` to `model`, or refuse without consuming anything:
        `allowed_max_tokens` then `reserve`. The one admission call of the metered routes.

        `requested_max_tokens` must be a valid client value (None: the client sent none).
        `context_window`, the model's max_model_len, keeps an implied max_tokens from
        exceeding what the model can generate after the prompt; a client's max_tokens (after
        the key's cap) beyond it can never be served: `BeyondContext`, before anything is
        reserved. `choices` sequences (n, or a batch of prompts) each generate up to
        max_tokens, so the reservation is the prompt estimate plus `choices` x max_tokens;
        `longest_prompt_estimate` (default: the whole estimate) is the longest single prompt,
        which is what the context window has to hold beside max_tokens.
        """
        scopes = scoped_limits(key, model)
        longest = longest_prompt_estimate
        if longest is None:
            longest = prompt_tokens_estimate
        max_tokens = self.allowed_max_tokens(scopes, requested_max_tokens, longest, context_window)
        window = context_window
        if requested_max_tokens is not None and window is not None and max_tokens > window:
            raise BeyondContext(requested_max_tokens, window)
        # The other choices' completions are booked with the prompt: one reservation.
        reserved_prompt = prompt_tokens_estimate + (choices - 1) * max_tokens
        return await self.reserve(scopes, reserved_prompt, max_tokens)

    async def reserve(
        self, scopes: tuple[ScopedLimits, ...], prompt_tokens_estimate: int, max_tokens: int
    ) -> Admission | Refusal:
        """Reserve `prompt_tokens_estimate + max_tokens` (max_tokens already allowed) in every
        scope, or refuse without consuming anything."""
        if prompt_tokens_estimate < 0:
            raise ValueError(f"prompt_tokens_estimate must be >= 0, got {prompt_tokens_estimate}")
        outcome, status = await self.store.try_reserve(
            scopes, prompt_tokens_estimate, max_tokens, self._lease_ttl
        )
        if isinstance(outcome, Refusal):
            return replace(outcome, rate_limit=status)
        return Admission(lease=outcome, max_tokens=max_tokens, rate_limit=status)

    def allowed_max_tokens(
        self,
        scopes: tuple[ScopedLimits, ...],
        requested: int | None,
        prompt_tokens_estimate: int = 0,
        context_window: int | None = None,
    ) -> int:
        """The client's value capped by every scope's `max_tokens`; when absent, the cap (or
        the engine default) further limited by the room the context window leaves and by the
        smallest token limit (so that a request without max_tokens never needs more than its
        key could ever grant, which would be refused outright)."""
        caps = [limits.max_tokens for _, limits in scopes if limits.max_tokens is not None]
        cap = min(caps) if caps else None
        if requested is not None:
            return requested if cap is None else min(requested, cap)
        implied = self._default_max_tokens if cap is None else cap
        rooms = [context_window] if context_window is not None else []
        for _, limits in scopes:
            rooms.extend(
                limit
                for limit in (limits.tpm, limits.tokens_per_day, limits.tokens_per_month)
                if limit is not None
            )
        if rooms:
            implied = min(implied, max(1, min(rooms) - prompt_tokens_estimate))
        return implied

    async def settle(
        self, lease: Lease, prompt_tokens: int | None, completion_tokens: int | None
    ) -> bool:
        """The response ended normally; charge vLLM's usage. A count that is unknown (None,
        e.g. the usage chunk never came) is charged at its reserved amount."""
        return await self.store.finish(
            lease, LeaseState.SETTLED, _charge(lease, prompt_tokens, completion_tokens)
        )

    async def abort(
        self, lease: Lease, prompt_tokens: int | None, completion_tokens: int | None
    ) -> bool:
        """The client disconnected; charge what was generated so far (unknown: reserved)."""
        return await self.store.finish(
            lease, LeaseState.ABORTED, _charge(lease, prompt_tokens, completion_tokens)
        )

    async def fail(self, lease: Lease) -> bool:
        """The upstream produced nothing (error, reset, timeout before the first byte)."""
        return await self.store.finish(lease, LeaseState.FAILED, 0)

    async def withdraw(self, lease: Lease) -> bool:
        """The gateway refused the request after admitting it, before the upstream saw it:
        free the slot and take back the whole reservation and the request."""
        return await self.store.finish(lease, LeaseState.WITHDRAWN, 0)

    async def renew(self, lease: Lease) -> bool:
        """Keep a long stream's lease from expiring; False if it has already ended."""
        return await self.store.renew(lease, self._lease_ttl)

    async def reclaim_expired(self) -> int:
        return await self.store.reclaim_expired()

    async def precheck(self, key: QuotaSubject) -> Refusal | None:
        """The key-wide limits that need no body (concurrency, requests/min) as they stand,
        before a large body is read: the refusal `admit` would give, or None. Not a
        reservation: a request that passes is still admitted (or refused) by `admit`."""
        limits = key.limits
        if limits.max_concurrency is None and limits.rpm is None:
            return None
        scope = Scope(key.key_id)
        usage = await self.store.usage(scope)
        limit = limits.max_concurrency
        if limit is not None and usage.in_flight + 1 > limit:
            wait = CONCURRENCY_RETRY_SECONDS if limit > 0 else math.inf
            return Refusal(RefusalReason.CONCURRENCY, scope, limit, usage.in_flight, 1, wait)
        limit = limits.rpm
        if limit is not None and usage.requests_in_window + 1 > limit:
            status = await self.store.status((ScopedLimits(scope, limits),))
            wait = status.requests.reset_after if status.requests is not None else math.inf
            used = usage.requests_in_window
            return Refusal(
                RefusalReason.RPM, scope, limit, used, 1, wait if limit > 0 else math.inf
            )
        return None

    async def status(self, key: QuotaSubject, model: str) -> RateLimitStatus:
        """Header values for a response that did not go through `admit`."""
        return await self.store.status(scoped_limits(key, model))


def _charge(lease: Lease, prompt_tokens: int | None, completion_tokens: int | None) -> int:
    # Negative counts can only come from a garbled upstream; treat them as unknown.
    prompt = lease.prompt_estimate if prompt_tokens is None or prompt_tokens < 0 else prompt_tokens
    completion = (
        lease.max_tokens
        if completion_tokens is None or completion_tokens < 0
        else completion_tokens
    )
    return prompt + completion
