"""Admission, settlement and refusals with hand-computed expectations."""

from __future__ import annotations

import asyncio
import math
from dataclasses import replace

import pytest

from serving.gateway.quota import (
    Admission,
    InMemoryQuotaStore,
    LeaseState,
    Limits,
    ManualClock,
    QuotaEngine,
    Refusal,
    RefusalReason,
    Scope,
    ScopeUsage,
)
from serving.gateway.quota.engine import BeyondContext
from tests.gateway.quota.running import run_async
from tests.gateway.quota.subjects import Subject, utc

KEY = Scope("key_a")


def make_engine(
    *, wall: float = utc(2024, 5, 10, 12), ttl: float = 600.0
) -> tuple[QuotaEngine, ManualClock]:
    clock = ManualClock(monotonic=1000.0, wall=wall)
    return QuotaEngine(InMemoryQuotaStore(clock), default_max_tokens=256, lease_ttl=ttl), clock


def admitted(outcome: Admission | Refusal) -> Admission:
    assert isinstance(outcome, Admission), outcome
    return outcome


def refused(outcome: Admission | Refusal) -> Refusal:
    assert isinstance(outcome, Refusal), outcome
    return outcome


@run_async
async def test_settle_replaces_the_reservation_by_actual_usage() -> None:
    engine, _ = make_engine()
    key = Subject("key_a", Limits(tpm=1000, tokens_per_day=5000))
    admission = admitted(await engine.admit(key, "m", 40, 100))
    assert admission.max_tokens == 100
    assert await engine.store.usage(KEY) == ScopeUsage(1, 1, 140, 140, 140)
    assert await engine.settle(admission.lease, 35, 20)
    assert admission.lease.state is LeaseState.SETTLED
    assert admission.lease.charged_tokens == 55
    assert await engine.store.usage(KEY) == ScopeUsage(0, 1, 55, 55, 55)


@run_async
async def test_ending_a_lease_twice_is_a_no_op() -> None:
    engine, _ = make_engine()
    key = Subject("key_a")
    lease = admitted(await engine.admit(key, "m", 10, 10)).lease
    assert await engine.settle(lease, 10, 5)
    usage = await engine.store.usage(KEY)
    assert not await engine.settle(lease, 10, 10)
    assert not await engine.abort(lease, 1, 1)
    assert not await engine.fail(lease)
    assert not await engine.renew(lease)
    assert await engine.store.usage(KEY) == usage
    assert lease.charged_tokens == 15


@run_async
async def test_abort_charges_partial_usage_and_unknown_counts_at_their_reservation() -> None:
    engine, _ = make_engine()
    key = Subject("key_a")
    first = admitted(await engine.admit(key, "m", 30, 100)).lease
    assert await engine.abort(first, 25, 7)
    assert first.charged_tokens == 32
    second = admitted(await engine.admit(key, "m", 30, 100)).lease
    # Disconnected before the usage chunk: prompt unknown (estimate), 12 tokens relayed.
    assert await engine.abort(second, None, 12)
    assert second.charged_tokens == 42
    third = admitted(await engine.admit(key, "m", 30, 100)).lease
    # A garbled usage report (negative) counts as unknown, not as a refund.
    assert await engine.settle(third, -1, None)
    assert third.charged_tokens == 130
    assert (await engine.store.usage(KEY)).tokens_today == 32 + 42 + 130


@run_async
async def test_fail_charges_no_tokens_but_keeps_the_request_counted() -> None:
    engine, _ = make_engine()
    key = Subject("key_a", Limits(rpm=1, max_concurrency=1))
    lease = admitted(await engine.admit(key, "m", 30, 100)).lease
    assert await engine.fail(lease)
    assert lease.state is LeaseState.FAILED
    assert await engine.store.usage(KEY) == ScopeUsage(0, 1, 0, 0, 0)
    assert refused(await engine.admit(key, "m", 1, 1)).reason is RefusalReason.RPM


@run_async
async def test_max_tokens_is_capped_by_key_and_model_and_defaults_to_the_cap() -> None:
    engine, _ = make_engine()
    key = Subject("key_a", Limits(max_tokens=100), {"small": Limits(max_tokens=30)})
    assert admitted(await engine.admit(key, "m", 5, None)).max_tokens == 100
    assert admitted(await engine.admit(key, "m", 5, 50)).max_tokens == 50
    assert admitted(await engine.admit(key, "m", 5, 10**9)).max_tokens == 100
    assert admitted(await engine.admit(key, "small", 5, None)).max_tokens == 30
    assert admitted(await engine.admit(key, "small", 5, 60)).max_tokens == 30
    uncapped = Subject("key_b")
    assert admitted(await engine.admit(uncapped, "m", 5, None)).max_tokens == 256  # engine default
    assert admitted(await engine.admit(uncapped, "m", 5, 5000)).max_tokens == 5000


@run_async
async def test_implied_max_tokens_fits_the_context_window_but_explicit_values_are_kept() -> None:
    engine, _ = make_engine()
    key = Subject("key_a", Limits(max_tokens=1000))
    assert admitted(await engine.admit(key, "m", 2000, None, context_window=2048)).max_tokens == 48
    assert admitted(await engine.admit(key, "m", 3000, None, context_window=2048)).max_tokens == 1
    assert admitted(await engine.admit(key, "m", 100, None, context_window=2048)).max_tokens == 1000
    # An explicit value the context cannot hold is vLLM's 400 to give, not ours to shrink.
    assert admitted(await engine.admit(key, "m", 2000, 500, context_window=2048)).max_tokens == 500


@run_async
async def test_implied_max_tokens_fits_the_smallest_token_limit() -> None:
    key = Subject("key_a", Limits(tpm=100), {"m": Limits(tokens_per_day=60)})
    assert admitted(await make_engine()[0].admit(key, "other", 10, None)).max_tokens == 90
    assert admitted(await make_engine()[0].admit(key, "m", 10, None)).max_tokens == 50
    assert refused(await make_engine()[0].admit(key, "m", 10, 80)).too_large  # explicit: kept


@run_async
async def test_requests_per_minute_window_rolls_over_after_61_buckets() -> None:
    engine, clock = make_engine()
    key = Subject("key_a", Limits(rpm=2))
    admitted(await engine.admit(key, "m", 1, 1))  # t=1000.0, bucket 1000
    clock.advance(0.5)
    admitted(await engine.admit(key, "m", 1, 1))
    clock.advance(0.4)  # t=1000.9
    refusal = refused(await engine.admit(key, "m", 1, 1))
    assert refusal.reason is RefusalReason.RPM
    assert (refusal.limit, refusal.used, refusal.requested) == (2, 2, 1)
    assert refusal.retry_after == pytest.approx(1061 - 1000.9)
    assert refusal.retry_after_header == "61"
    assert (refusal.error_type, refusal.code, refusal.status) == (
        "requests",
        "rate_limit_exceeded",
        429,
    )
    clock.advance(60.0)  # t=1060.9: bucket 1000 is exactly 60 back, still counted
    assert refused(await engine.admit(key, "m", 1, 1)).reason is RefusalReason.RPM
    clock.advance(0.1)  # t=1061.0
    admitted(await engine.admit(key, "m", 1, 1))


@run_async
async def test_tokens_per_minute_counts_reservations_and_refunds_make_room() -> None:
    engine, clock = make_engine()
    key = Subject("key_a", Limits(tpm=1000))
    first = admitted(await engine.admit(key, "m", 100, 500)).lease  # holds 600
    refusal = refused(await engine.admit(key, "m", 100, 400))  # 600 + 500 > 1000
    assert refusal.reason is RefusalReason.TPM
    assert (refusal.error_type, refusal.code) == ("tokens", "rate_limit_exceeded")
    assert (refusal.used, refusal.requested) == (600, 500)
    assert refusal.retry_after == pytest.approx(61.0)
    assert "tokens per minute" in refusal.message
    clock.advance(5)
    await engine.settle(first, 80, 20)  # 600 -> 100 in bucket 1000
    admitted(await engine.admit(key, "m", 100, 400))  # 100 + 500 <= 1000
    assert (await engine.store.usage(KEY)).tokens_in_window == 600


@run_async
async def test_request_larger_than_a_limit_is_refused_as_too_large() -> None:
    engine, _ = make_engine()
    key = Subject("key_a", Limits(tpm=100))
    refusal = refused(await engine.admit(key, "m", 50, 60))
    assert refusal.too_large
    assert refusal.retry_after == math.inf
    assert refusal.retry_after_header == "60"
    assert refusal.message.startswith("Request too large for tokens per minute on key key_a")
    assert await engine.store.usage(KEY) == ScopeUsage(0, 0, 0, 0, 0)


@run_async
async def test_daily_budget_is_a_utc_calendar_day() -> None:
    engine, clock = make_engine(wall=utc(2024, 5, 10, 23, 59, 30))
    key = Subject("key_a", Limits(tokens_per_day=100))
    lease = admitted(await engine.admit(key, "m", 10, 50)).lease
    await engine.settle(lease, 10, 20)  # 30 spent today
    admitted(await engine.admit(key, "m", 10, 50))  # 30 + 60 = 90 <= 100, still in flight
    refusal = refused(await engine.admit(key, "m", 10, 50))  # 90 + 60 > 100
    assert refusal.reason is RefusalReason.DAILY
    assert (refusal.error_type, refusal.code) == ("insufficient_quota", "insufficient_quota")
    assert refusal.retry_after == 30  # until 00:00 UTC
    assert refusal.message.startswith("Quota of tokens per day (UTC) spent on key key_a")
    clock.advance(30)  # 2024-05-11T00:00:00Z
    admitted(await engine.admit(key, "m", 10, 50))
    assert (await engine.store.usage(KEY)).tokens_today == 60


@run_async
async def test_a_lease_settled_after_midnight_corrects_the_day_it_was_reserved_in() -> None:
    engine, clock = make_engine(wall=utc(2024, 5, 10, 23, 59, 50))
    key = Subject("key_a", Limits(tokens_per_day=1000))
    lease = admitted(await engine.admit(key, "m", 10, 500)).lease
    clock.advance(20)
    assert await engine.settle(lease, 10, 10)  # refund of 490 belongs to May 10th
    assert (await engine.store.usage(KEY)).tokens_today == 0
    assert (await engine.store.usage(KEY)).in_flight == 0


@run_async
async def test_monthly_budget_resets_on_the_first_of_the_month() -> None:
    engine, clock = make_engine(wall=utc(2024, 2, 29, 23, 0))
    key = Subject("key_a", Limits(tokens_per_month=100))
    await engine.settle(admitted(await engine.admit(key, "m", 50, 50)).lease, 50, 50)
    refusal = refused(await engine.admit(key, "m", 1, 1))
    assert refusal.reason is RefusalReason.MONTHLY
    assert refusal.retry_after == 3600
    assert refusal.code == "insufficient_quota"
    clock.advance(3600)  # 2024-03-01T00:00:00Z
    admitted(await engine.admit(key, "m", 50, 50))


@run_async
async def test_concurrency_refusal_consumes_nothing() -> None:
    engine, _ = make_engine()
    key = Subject("key_a", Limits(rpm=10, tpm=1000, tokens_per_day=10_000, max_concurrency=1))
    lease = admitted(await engine.admit(key, "m", 10, 90)).lease
    before = await engine.store.usage(KEY)
    refusal = refused(await engine.admit(key, "m", 10, 90))
    assert refusal.reason is RefusalReason.CONCURRENCY
    assert (refusal.error_type, refusal.code) == ("requests", "rate_limit_exceeded")
    assert refusal.retry_after_header == "1"
    assert await engine.store.usage(KEY) == before == ScopeUsage(1, 1, 100, 100, 100)
    await engine.settle(lease, 10, 5)
    admitted(await engine.admit(key, "m", 10, 90))


@run_async
async def test_refusal_reports_the_longest_wait_among_failing_limits() -> None:
    engine, _ = make_engine(wall=utc(2024, 5, 10, 18))
    key = Subject("key_a", Limits(rpm=1, tokens_per_day=10, max_concurrency=1))
    admitted(await engine.admit(key, "m", 5, 5))
    refusal = refused(await engine.admit(key, "m", 5, 5))  # concurrency, rpm and daily all refuse
    assert refusal.reason is RefusalReason.DAILY
    assert refusal.retry_after == 6 * 3600


@run_async
async def test_per_model_limits_are_separate_counters_on_top_of_the_key() -> None:
    engine, _ = make_engine()
    key = Subject("key_a", Limits(rpm=10), {"big": Limits(rpm=2)})
    admitted(await engine.admit(key, "big", 1, 1))
    admitted(await engine.admit(key, "big", 1, 1))
    refusal = refused(await engine.admit(key, "big", 1, 1))
    assert refusal.scope == Scope("key_a", "big")
    assert "on key key_a for model big" in refusal.message
    admitted(await engine.admit(key, "small", 1, 1))
    assert (await engine.store.usage(KEY)).requests_in_window == 3
    assert (await engine.store.usage(Scope("key_a", "big"))).requests_in_window == 2


@run_async
async def test_key_limit_refuses_even_when_the_model_limit_has_room() -> None:
    engine, _ = make_engine()
    key = Subject("key_a", Limits(max_concurrency=1), {"big": Limits(max_concurrency=5)})
    admitted(await engine.admit(key, "small", 1, 1))
    refusal = refused(await engine.admit(key, "big", 1, 1))
    assert refusal.scope == KEY
    assert (await engine.store.usage(Scope("key_a", "big"))).in_flight == 0


@run_async
async def test_rate_limit_status_shows_the_tighter_scope() -> None:
    engine, clock = make_engine()
    key = Subject("key_a", Limits(rpm=10, tpm=1000), {"big": Limits(rpm=3)})
    admission = admitted(await engine.admit(key, "big", 10, 90))
    status = admission.rate_limit
    assert status.requests is not None and status.tokens is not None
    assert (status.requests.limit, status.requests.remaining) == (3, 2)
    assert (status.tokens.limit, status.tokens.remaining) == (1000, 900)
    assert status.tokens.reset_after == 61.0
    clock.advance(10)
    later = await engine.status(key, "small")
    assert later.requests is not None
    assert (later.requests.limit, later.requests.remaining) == (10, 9)
    assert later.requests.reset_after == 51.0


@run_async
async def test_refusal_carries_the_status_for_its_headers() -> None:
    engine, _ = make_engine()
    key = Subject("key_a", Limits(rpm=1))
    admitted(await engine.admit(key, "m", 1, 1))
    refusal = refused(await engine.admit(key, "m", 1, 1))
    assert refusal.rate_limit.requests is not None
    assert refusal.rate_limit.requests.remaining == 0


@run_async
async def test_expired_leases_are_reclaimed_with_their_reservation_charged() -> None:
    engine, clock = make_engine(ttl=30)
    key = Subject("key_a", Limits(max_concurrency=1))
    lease = admitted(await engine.admit(key, "m", 10, 90)).lease
    clock.advance(29)
    assert await engine.reclaim_expired() == 0
    clock.advance(1)
    # Reclaiming also happens inside admit: the slot is free again.
    second = admitted(await engine.admit(key, "m", 10, 10)).lease
    assert lease.state is LeaseState.EXPIRED
    assert lease.charged_tokens == 100
    assert not await engine.settle(lease, 1, 1)  # too late: charged once, at expiry
    assert (await engine.store.usage(KEY)).in_flight == 1
    await engine.settle(second, 10, 10)
    assert await engine.store.usage(KEY) == ScopeUsage(0, 2, 120, 120, 120)


@run_async
async def test_renew_keeps_a_long_stream_alive() -> None:
    engine, clock = make_engine(ttl=30)
    key = Subject("key_a")
    lease = admitted(await engine.admit(key, "m", 1, 1)).lease
    clock.advance(20)
    assert await engine.renew(lease)
    clock.advance(20)
    assert await engine.reclaim_expired() == 0
    clock.advance(10)
    assert await engine.reclaim_expired() == 1
    assert not await engine.renew(lease)


@run_async
async def test_a_lease_from_another_store_is_not_ended() -> None:
    engine, _ = make_engine()
    other, _ = make_engine()
    key = Subject("key_a")
    lease = admitted(await other.admit(key, "m", 1, 1)).lease
    admitted(await engine.admit(key, "m", 1, 1))  # its own lease: ids never collide
    assert not await engine.settle(lease, 1, 1)
    assert (await engine.store.usage(KEY)).in_flight == 1


@run_async
async def test_many_leases_do_not_grow_the_expiry_heap_without_bound() -> None:
    engine, _ = make_engine()
    key = Subject("key_a")
    for _ in range(10_000):
        await engine.settle(admitted(await engine.admit(key, "m", 1, 1)).lease, 1, 1)
    store = engine.store
    assert isinstance(store, InMemoryQuotaStore)
    assert len(store._expiries) <= 64 + 2


@run_async
async def test_concurrent_admissions_on_one_loop_admit_exactly_the_concurrency_limit() -> None:
    engine, _ = make_engine()
    limit = 7
    key = Subject("key_a", Limits(max_concurrency=limit))

    async def one_request(started: asyncio.Event) -> bool:
        await started.wait()  # everyone asks at once
        outcome = await engine.admit(key, "m", 10, 10)
        if isinstance(outcome, Refusal):
            assert outcome.reason is RefusalReason.CONCURRENCY
            return False
        await asyncio.sleep(0.01)  # hold the slot across awaits, like a stream
        assert await engine.settle(outcome.lease, 10, 5)
        return True

    async def burst() -> list[bool]:
        started = asyncio.Event()
        tasks = [asyncio.create_task(one_request(started)) for _ in range(200)]
        await asyncio.sleep(0)
        started.set()
        return await asyncio.gather(*tasks)

    results = await burst()
    assert results.count(True) == limit
    usage = await engine.store.usage(KEY)
    assert usage.in_flight == 0
    assert usage.requests_in_window == limit  # the 193 refusals counted nothing
    assert usage.tokens_in_window == limit * 15


@run_async
async def test_burst_against_requests_per_minute_admits_exactly_the_limit() -> None:
    engine, _ = make_engine()
    key = Subject("key_a", Limits(rpm=25))
    outcomes = [await engine.admit(key, "m", 1, 1) for _ in range(40)]
    assert sum(isinstance(outcome, Admission) for outcome in outcomes) == 25


@run_async
async def test_n_choices_are_one_reservation_of_the_prompt_and_n_completions() -> None:
    engine, _ = make_engine()
    key = Subject("key_a", Limits(tpm=1000, max_tokens=100))
    admission = admitted(await engine.admit(key, "m", 40, 500, choices=3))
    assert admission.max_tokens == 100  # the key's cap, for each choice
    assert admission.lease.prompt_estimate == 40 + 2 * 100
    assert await engine.store.usage(KEY) == ScopeUsage(1, 1, 340, 340, 340)
    assert refused(await engine.admit(key, "m", 40, 100, choices=7)).reason is RefusalReason.TPM


@run_async
async def test_a_max_tokens_the_context_cannot_hold_is_refused_before_reserving() -> None:
    engine, _ = make_engine()
    key = Subject("key_a", Limits(rpm=5, max_tokens=10_000))
    with pytest.raises(BeyondContext) as caught:
        await engine.admit(key, "m", 40, 5000, context_window=4096)
    assert (caught.value.requested, caught.value.context_window) == (5000, 4096)
    assert await engine.store.usage(KEY) == ScopeUsage(0, 0, 0, 0, 0)
    # Capped by the key below the window, or implied: fitted, never refused.
    capped = Subject("key_a", Limits(max_tokens=1000))
    fitted = admitted(await engine.admit(capped, "m", 40, 5000, context_window=4096))
    assert fitted.max_tokens == 1000
    implied = admitted(await engine.admit(key, "m", 40, None, context_window=4096))
    assert implied.max_tokens == 4096 - 40


@run_async
async def test_precheck_gives_the_refusal_admit_would_for_limits_that_need_no_body() -> None:
    engine, _ = make_engine()
    key = Subject("key_a", Limits(max_concurrency=1, rpm=2))
    assert await engine.precheck(key) is None
    first = admitted(await engine.admit(key, "m", 1, 1))
    busy, admission_says = await engine.precheck(key), refused(await engine.admit(key, "m", 1, 1))
    assert busy is not None and busy.reason is RefusalReason.CONCURRENCY
    assert replace(busy, rate_limit=admission_says.rate_limit) == admission_says
    assert await engine.settle(first.lease, 1, 1)
    second = admitted(await engine.admit(key, "m", 1, 1))
    assert await engine.settle(second.lease, 1, 1)
    late, admission_says = await engine.precheck(key), refused(await engine.admit(key, "m", 1, 1))
    assert late is not None and late.reason is RefusalReason.RPM is admission_says.reason
    assert admission_says.retry_after <= late.retry_after <= 61  # never sooner than admit says
    assert await engine.precheck(Subject("key_b", Limits(tpm=10))) is None  # nothing to check
