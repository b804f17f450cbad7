"""A store's own operations, below the engine: reserve, finish, renew, expire, over every
store (`quota_store`: in-memory and Redis).

The engine-level rules (windows, budgets, charge-exactly-once) are held against a model by
`test_state_machine`; these pin the store's contract with hand-computed numbers.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from serving.gateway.quota import (
    InMemoryQuotaStore,
    Lease,
    LeaseState,
    Limits,
    ManualClock,
    QuotaStore,
    Refusal,
    RefusalReason,
    Scope,
    ScopedLimits,
    WindowStatus,
)
from serving.gateway.quota.store import MAX_RESERVATION, check_reservation
from tests.gateway.quota.conftest import StoreFactory
from tests.gateway.quota.running import run_async

SCOPE = Scope("k1", None)
LIMITED = (ScopedLimits(SCOPE, Limits(max_concurrency=1, tpm=1000)),)


async def reserve(store: QuotaStore, tokens: int = 10, ttl: float = 60) -> Lease | Refusal:
    outcome, _ = await store.try_reserve(LIMITED, tokens, tokens, ttl)
    return outcome


@run_async
async def test_a_refusal_books_nothing(quota_store: StoreFactory) -> None:
    async with quota_store(ManualClock()) as store:
        lease = await reserve(store)
        assert isinstance(lease, Lease)
        refusal = await reserve(store)
        assert isinstance(refusal, Refusal) and refusal.reason is RefusalReason.CONCURRENCY
        usage = await store.usage(SCOPE)
        assert (usage.in_flight, usage.requests_in_window, usage.tokens_in_window) == (1, 1, 20)


@run_async
async def test_try_reserve_reports_the_rate_limit_state_after_itself(
    quota_store: StoreFactory,
) -> None:
    clock = ManualClock()
    async with quota_store(clock) as store:
        scopes = (
            ScopedLimits(SCOPE, Limits(rpm=5, tpm=1000)),
            ScopedLimits(Scope("k1", "m"), Limits(rpm=2, max_concurrency=1)),
        )
        lease, status = await store.try_reserve(scopes, 10, 30, 60)
        assert isinstance(lease, Lease)
        assert status == await store.status(scopes)
        assert status.requests == WindowStatus(2, 1, 61.0)  # the per-model scope has less left
        assert status.tokens == WindowStatus(1000, 960, 61.0)
        clock.advance(0.5)
        refusal, refused_status = await store.try_reserve(scopes, 10, 30, 60)
        assert isinstance(refusal, Refusal) and refusal.reason is RefusalReason.CONCURRENCY
        assert refused_status == await store.status(scopes)  # unchanged by the refusal
        assert refused_status.requests == WindowStatus(2, 1, 60.5)


@run_async
async def test_finish_ends_a_lease_once_and_books_its_charge(quota_store: StoreFactory) -> None:
    async with quota_store(ManualClock()) as store:
        lease = await reserve(store)
        assert isinstance(lease, Lease)
        assert await store.finish(lease, LeaseState.SETTLED, 7)
        assert not await store.finish(
            lease, LeaseState.ABORTED, 100
        )  # idempotent: no second charge
        usage = await store.usage(SCOPE)
        assert (usage.in_flight, usage.tokens_in_window, usage.tokens_today) == (0, 7, 7)
        assert store.active_leases() == 0


@run_async
async def test_an_in_memory_store_refuses_a_lease_it_did_not_issue_and_non_endings() -> None:
    store, other = InMemoryQuotaStore(ManualClock()), InMemoryQuotaStore(ManualClock())
    lease = await reserve(store)
    assert isinstance(lease, Lease)
    assert not await other.finish(lease, LeaseState.SETTLED, 1)
    with pytest.raises(ValueError, match="not an ending"):
        await store.finish(lease, LeaseState.EXPIRED, 1)


@run_async
async def test_unrenewed_leases_expire_with_their_whole_reservation_and_renewed_ones_live(
    quota_store: StoreFactory,
) -> None:
    clock = ManualClock()
    async with quota_store(clock) as store:
        kept, _ = await store.try_reserve((ScopedLimits(Scope("k2", None), Limits()),), 5, 5, 10)
        lost = await reserve(store, ttl=10)
        assert isinstance(kept, Lease) and isinstance(lost, Lease)
        clock.advance(8)
        assert await store.renew(kept, 10)
        clock.advance(5)
        assert await store.reclaim_expired() == 1
        assert not lost.active and kept.active
        assert (
            await store.usage(SCOPE)
        ).tokens_in_window == 20  # an expired lease is charged in full
        assert not await store.renew(lost, 10)
        assert isinstance(await reserve(store), Lease)  # its slot is free again


_ANY_VALUE = st.one_of(
    st.integers(min_value=-(2**60), max_value=2**60),
    st.just(MAX_RESERVATION),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.text(max_size=3),
)


@given(prompt=_ANY_VALUE, max_tokens=_ANY_VALUE, ttl=_ANY_VALUE)
def test_check_reservation_accepts_exactly_counts_a_counter_can_hold(
    prompt: object, max_tokens: object, ttl: object
) -> None:
    # Its one-expression fast path (every request takes it) must agree with the rule.
    counts_ok = all(
        isinstance(value, int) and not isinstance(value, bool) and value >= 0
        for value in (prompt, max_tokens)
    )
    holdable = counts_ok and prompt + max_tokens <= MAX_RESERVATION  # type: ignore[operator]
    ttl_ok = isinstance(ttl, int | float) and not isinstance(ttl, bool) and 0 < ttl < float("inf")
    if holdable and ttl_ok:
        check_reservation(prompt, max_tokens, ttl)
    else:
        with pytest.raises(ValueError):
            check_reservation(prompt, max_tokens, ttl)
