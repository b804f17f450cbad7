"""The in-memory store's own operations, below the engine: reserve, finish, renew, expire.

The engine-level rules (windows, budgets, charge-exactly-once) are held against a model by
`test_state_machine`; these pin the store's contract that a shared store must also keep.
"""

from __future__ import annotations

import pytest

from serving.gateway.quota import (
    InMemoryQuotaStore,
    Lease,
    LeaseState,
    Limits,
    ManualClock,
    Refusal,
    RefusalReason,
    Scope,
    ScopedLimits,
    WindowStatus,
)

SCOPE = Scope("k1", None)
LIMITED = (ScopedLimits(SCOPE, Limits(max_concurrency=1, tpm=1000)),)


def reserve(store: InMemoryQuotaStore, tokens: int = 10, ttl: float = 60) -> Lease | Refusal:
    outcome, _ = store.try_reserve(LIMITED, tokens, tokens, ttl)
    return outcome


def test_a_refusal_books_nothing() -> None:
    store = InMemoryQuotaStore(ManualClock())
    lease = reserve(store)
    assert isinstance(lease, Lease)
    refusal = reserve(store)
    assert isinstance(refusal, Refusal) and refusal.reason is RefusalReason.CONCURRENCY
    usage = store.usage(SCOPE)
    assert (usage.in_flight, usage.requests_in_window, usage.tokens_in_window) == (1, 1, 20)


def test_try_reserve_reports_the_rate_limit_state_after_itself() -> None:
    clock = ManualClock()
    store = InMemoryQuotaStore(clock)
    scopes = (
        ScopedLimits(SCOPE, Limits(rpm=5, tpm=1000)),
        ScopedLimits(Scope("k1", "m"), Limits(rpm=2, max_concurrency=1)),
    )
    lease, status = store.try_reserve(scopes, 10, 30, 60)
    assert isinstance(lease, Lease)
    assert status == store.status(scopes)
    assert status.requests == WindowStatus(2, 1, 61.0)  # the per-model scope has less left
    assert status.tokens == WindowStatus(1000, 960, 61.0)
    clock.advance(0.5)
    refusal, refused_status = store.try_reserve(scopes, 10, 30, 60)
    assert isinstance(refusal, Refusal) and refusal.reason is RefusalReason.CONCURRENCY
    assert refused_status == store.status(scopes)  # unchanged by the refusal
    assert refused_status.requests == WindowStatus(2, 1, 60.5)


def test_finish_ends_a_lease_once_and_books_its_charge() -> None:
    store = InMemoryQuotaStore(ManualClock())
    lease = reserve(store)
    assert isinstance(lease, Lease)
    assert store.finish(lease, LeaseState.SETTLED, 7)
    assert not store.finish(lease, LeaseState.ABORTED, 100)  # idempotent: no second charge
    usage = store.usage(SCOPE)
    assert (usage.in_flight, usage.tokens_in_window, usage.tokens_today) == (0, 7, 7)
    assert store.active_leases() == 0


def test_finish_refuses_a_lease_it_did_not_issue_and_non_endings() -> None:
    store, other = InMemoryQuotaStore(ManualClock()), InMemoryQuotaStore(ManualClock())
    lease = reserve(store)
    assert isinstance(lease, Lease)
    assert not other.finish(lease, LeaseState.SETTLED, 1)
    with pytest.raises(ValueError, match="not an ending"):
        store.finish(lease, LeaseState.EXPIRED, 1)


def test_unrenewed_leases_expire_with_their_whole_reservation_and_renewed_ones_live() -> None:
    clock = ManualClock()
    store = InMemoryQuotaStore(clock)
    kept, _ = store.try_reserve((ScopedLimits(Scope("k2", None), Limits()),), 5, 5, 10)
    lost = reserve(store, ttl=10)
    assert isinstance(kept, Lease) and isinstance(lost, Lease)
    clock.advance(8)
    assert store.renew(kept, 10)
    clock.advance(5)
    assert store.reclaim_expired() == 1
    assert not lost.active and kept.active
    assert store.usage(SCOPE).tokens_in_window == 20  # an expired lease is charged in full
    assert not store.renew(lost, 10)
    assert isinstance(reserve(store), Lease)  # its slot is free again
