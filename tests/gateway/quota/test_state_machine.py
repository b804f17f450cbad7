"""Random interleavings of admit, settle, abort, fail, withdraw, renew, expiry and time, checked
against an independent model of what each lease holds, over every store (`quota_store`: the
in-memory one and the Redis one), so the two cannot drift apart.

Invariants: no limit is exceeded in any 60 s interval or calendar period; the store's
counters equal the model's; in-flight counts are never negative and return to zero; every
lease is charged exactly once; a refused request changes nothing; every admission or refusal,
its wait and its rate-limit state are what `decide` says about the model's counters.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Coroutine
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    multiple,
    rule,
    run_state_machine_as_test,
)

from serving.gateway.quota import (
    Lease,
    LeaseState,
    Limits,
    ManualClock,
    MinuteUsage,
    QuotaEngine,
    Refusal,
    Scope,
    ScopedLimits,
    ScopeState,
    decide,
    rate_limit_status,
)
from serving.gateway.quota.store import MAX_RESERVATION
from serving.gateway.quota.windows import bucket_of, utc_day, utc_month
from tests.gateway.quota.conftest import StoreFactory
from tests.gateway.quota.subjects import Subject, utc

T = TypeVar("T")

TTL = 30.0
DEFAULT_MAX_TOKENS = 50
KEYS = (
    Subject(
        "key_a",
        Limits(
            rpm=5,
            tpm=400,
            tokens_per_day=1500,
            tokens_per_month=3000,
            max_concurrency=3,
            max_tokens=60,
        ),
        {"m1": Limits(rpm=3, tpm=200, max_concurrency=2, max_tokens=40)},
    ),
    Subject("key_b", Limits(rpm=4, max_concurrency=2)),
    Subject(
        "key_c",
        Limits(tpm=300, tokens_per_day=800, max_tokens=100),
        {"m2": Limits(tokens_per_day=300, max_tokens=20)},
    ),
)
MODELS = ("m1", "m2", "m3")
ALL_SCOPES: dict[Scope, Limits] = {Scope(key.key_id): key.limits for key in KEYS} | {
    Scope(key.key_id, model): limits for key in KEYS for model, limits in key.model_limits.items()
}
# Two minutes before a day and a month end, so short runs cross both.
START_WALL = utc(2024, 1, 31, 23, 58)


@dataclass
class Admitted:
    lease: Lease
    scopes: tuple[Scope, ...]
    at: float  # monotonic seconds at admission
    day: str
    month: str
    reserved: int
    charge: int  # what it holds: the reservation while active, the charge once ended
    expires_at: float
    endings: int = 0
    counted: bool = True  # against requests/min: until withdrawn


class QuotaMachine(RuleBasedStateMachine):
    admissions = Bundle("admissions")

    make_store: StoreFactory  # set by `test_quota_machine` for each store

    def __init__(self) -> None:
        super().__init__()
        # Both clocks start on a whole second, so a store that keeps its windows on the wall
        # clock (Redis) has the same buckets as one on the monotonic clock.
        self.clock = ManualClock(monotonic=1000.0, wall=START_WALL)
        # One loop per example: a shared store's client lives on it.
        self.loop = asyncio.new_event_loop()
        self.stack = contextlib.AsyncExitStack()
        self.store = self.run(self.stack.enter_async_context(self.make_store(self.clock)))
        self.engine = QuotaEngine(self.store, default_max_tokens=DEFAULT_MAX_TOKENS, lease_ttl=TTL)
        self.records: list[Admitted] = []

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coroutine)

    @rule(
        target=admissions,
        key_index=st.integers(0, len(KEYS) - 1),
        model=st.sampled_from(MODELS),
        prompt=st.integers(0, 120),
        requested=st.none() | st.integers(1, 150),
    )
    def admit(self, key_index: int, model: str, prompt: int, requested: int | None) -> object:
        key = KEYS[key_index]
        scopes = (Scope(key.key_id),) + (
            (Scope(key.key_id, model),) if model in key.model_limits else ()
        )
        # Reclaim first, so the snapshot below cannot differ merely by an expiry.
        self.reclaim()
        before = [self.run(self.store.usage(scope)) for scope in scopes]
        limited = [ScopedLimits(scope, ALL_SCOPES[scope]) for scope in scopes]
        allowed = self.engine.allowed_max_tokens(tuple(limited), requested, prompt)
        ruling = decide(limited, self.model_states(scopes), prompt + allowed, *self.now())
        outcome = self.run(self.engine.admit(key, model, prompt, requested))
        if isinstance(outcome, Refusal):
            assert ruling is not None
            status = rate_limit_status(limited, self.model_states(scopes), self.now()[0])
            assert outcome == replace(ruling, rate_limit=status)
            assert [self.run(self.store.usage(scope)) for scope in scopes] == before
            return multiple()
        assert ruling is None
        caps = [ALL_SCOPES[scope].max_tokens for scope in scopes]
        cap = min((value for value in caps if value is not None), default=None)
        expected = DEFAULT_MAX_TOKENS if cap is None else cap
        token_limits = [
            limit
            for scope in scopes
            for limit in (
                ALL_SCOPES[scope].tpm,
                ALL_SCOPES[scope].tokens_per_day,
                ALL_SCOPES[scope].tokens_per_month,
            )
            if limit is not None
        ]
        if token_limits:  # an implied max_tokens never exceeds what the key could grant
            expected = min(expected, max(1, min(token_limits) - prompt))
        if requested is not None:
            expected = requested if cap is None else min(requested, cap)
        assert outcome.max_tokens == expected
        now, wall = self.clock.monotonic(), self.clock.wall()
        record = Admitted(
            lease=outcome.lease,
            scopes=scopes,
            at=now,
            day=utc_day(wall),
            month=utc_month(wall),
            reserved=prompt + expected,
            charge=prompt + expected,
            expires_at=now + TTL,
        )
        self.records.append(record)
        assert outcome.rate_limit == rate_limit_status(
            limited, self.model_states(scopes), self.now()[0]
        )
        return record

    @rule(
        key_index=st.integers(0, len(KEYS) - 1),
        model=st.sampled_from(MODELS),
        prompt=st.sampled_from([0, 5, -1, 2**53, 10**19, 1.5, True]),
        max_tokens=st.sampled_from([1, -3, 0.5, 2**51, 10**19 * 128, 10**40, False]),
        ttl=st.sampled_from([TTL, 0.0, -1.0, math.inf, math.nan]),
    )
    def absurd_reservation(
        self, key_index: int, model: str, prompt: Any, max_tokens: Any, ttl: float
    ) -> None:
        """A reservation no counter can hold (what `n: 10**19` once asked of Redis) is
        refused whole, before anything is booked: every counter stays as it was."""
        key = KEYS[key_index]
        scopes = (Scope(key.key_id),) + (
            (Scope(key.key_id, model),) if model in key.model_limits else ()
        )
        valid = (
            all(type(value) is int and value >= 0 for value in (prompt, max_tokens))
            and prompt + max_tokens <= MAX_RESERVATION
            and 0 < ttl < math.inf
        )
        if valid:
            return  # an ordinary reservation: `admit` covers those
        self.reclaim()
        before = [self.run(self.store.usage(scope)) for scope in scopes]
        limited = tuple(ScopedLimits(scope, ALL_SCOPES[scope]) for scope in scopes)
        with pytest.raises(ValueError):
            self.run(self.store.try_reserve(limited, prompt, max_tokens, ttl))
        assert [self.run(self.store.usage(scope)) for scope in scopes] == before

    def now(self) -> tuple[float, float]:
        return self.clock.monotonic(), self.clock.wall()

    def model_states(self, scopes: tuple[Scope, ...]) -> list[ScopeState]:
        """What each scope holds according to the model, as `decide` reads it."""
        now, wall = self.now()
        oldest_bucket = bucket_of(now) - 60
        states = []
        for scope in scopes:
            mine = [r for r in self.records if scope in r.scopes]
            requests: dict[int, int] = {}
            tokens: dict[int, int] = {}
            for r in sorted(mine, key=lambda r: r.at):
                if bucket_of(r.at) >= oldest_bucket:
                    requests[bucket_of(r.at)] = requests.get(bucket_of(r.at), 0) + r.counted
                    tokens[bucket_of(r.at)] = tokens.get(bucket_of(r.at), 0) + r.charge
            states.append(
                ScopeState(
                    in_flight=sum(1 for r in mine if r.endings == 0),
                    requests=MinuteUsage(sum(requests.values()), requests),
                    tokens=MinuteUsage(sum(tokens.values()), tokens),
                    tokens_today=sum(r.charge for r in mine if r.day == utc_day(wall)),
                    tokens_this_month=sum(r.charge for r in mine if r.month == utc_month(wall)),
                )
            )
        return states

    @rule(
        record=admissions,
        abort=st.booleans(),
        prompt_share=st.none() | st.floats(0, 1),
        completion_share=st.none() | st.floats(0, 1),
    )
    def settle_or_abort(
        self,
        record: Admitted,
        abort: bool,
        prompt_share: float | None,
        completion_share: float | None,
    ) -> None:
        lease = record.lease
        prompt = None if prompt_share is None else math.floor(prompt_share * lease.prompt_estimate)
        completion = (
            None if completion_share is None else math.floor(completion_share * lease.max_tokens)
        )
        end = self.engine.abort if abort else self.engine.settle
        charge = (lease.prompt_estimate if prompt is None else prompt) + (
            lease.max_tokens if completion is None else completion
        )
        self._ended(record, self.run(end(lease, prompt, completion)), charge)

    @rule(record=admissions)
    def fail(self, record: Admitted) -> None:
        self._ended(record, self.run(self.engine.fail(record.lease)), 0)

    @rule(record=admissions)
    def withdraw(self, record: Admitted) -> None:
        """Refused after admission (a check run after the reservation): nothing consumed,
        the request itself included."""
        applied = self.run(self.engine.withdraw(record.lease))
        self._ended(record, applied, 0)
        if applied:
            record.counted = False
            assert record.lease.state is LeaseState.WITHDRAWN

    @rule(record=admissions)
    def renew(self, record: Admitted) -> None:
        renewed = self.run(self.engine.renew(record.lease))
        assert renewed == (record.endings == 0)
        if renewed:
            record.expires_at = self.clock.monotonic() + TTL

    @rule(seconds=st.sampled_from([0.0, 0.3, 1.0, 7.0, 29.5, 31.0, 59.5, 60.0, 61.0, 600.0]))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @rule()
    def reclaim(self) -> None:
        now = self.clock.monotonic()
        due = [r for r in self.records if r.endings == 0 and r.expires_at <= now]
        assert self.run(self.engine.reclaim_expired()) == len(due)
        for record in due:
            assert record.lease.state is LeaseState.EXPIRED
            record.endings = 1  # charged its full reservation, once

    def _ended(self, record: Admitted, applied: bool, charge: int) -> None:
        assert applied == (record.endings == 0)
        if applied:
            record.endings = 1
            record.charge = charge
        assert record.lease.charged_tokens == record.charge

    @invariant()
    def in_flight_matches_and_respects_concurrency(self) -> None:
        for scope, limits in ALL_SCOPES.items():
            active = sum(1 for r in self.records if r.endings == 0 and scope in r.scopes)
            assert self.run(self.store.usage(scope)).in_flight == active >= 0
            if limits.max_concurrency is not None:
                assert active <= limits.max_concurrency

    @invariant()
    def no_sixty_second_interval_exceeds_a_minute_limit(self) -> None:
        for scope, limits in ALL_SCOPES.items():
            mine = [r for r in self.records if scope in r.scopes]
            for last in mine:
                # Every interval's admissions fit in the 60 s closed interval ending at its
                # last admission, so checking those intervals checks all of them.
                inside = [r for r in mine if last.at - 60 <= r.at <= last.at]
                if limits.rpm is not None:
                    assert sum(r.counted for r in inside) <= limits.rpm
                if limits.tpm is not None:
                    assert sum(r.charge for r in inside) <= limits.tpm

    @invariant()
    def no_calendar_period_exceeds_its_budget(self) -> None:
        for scope, limits in ALL_SCOPES.items():
            mine = [r for r in self.records if scope in r.scopes]
            for period in {r.day for r in mine}:
                spent = sum(r.charge for r in mine if r.day == period)
                assert limits.tokens_per_day is None or spent <= limits.tokens_per_day
            for period in {r.month for r in mine}:
                spent = sum(r.charge for r in mine if r.month == period)
                assert limits.tokens_per_month is None or spent <= limits.tokens_per_month

    @invariant()
    def store_counters_equal_the_model(self) -> None:
        now, wall = self.clock.monotonic(), self.clock.wall()
        oldest_bucket = math.floor(now) - 60
        for scope in ALL_SCOPES:
            mine = [r for r in self.records if scope in r.scopes]
            in_window = [r for r in mine if math.floor(r.at) >= oldest_bucket]
            usage = self.run(self.store.usage(scope))
            assert usage.requests_in_window == sum(r.counted for r in in_window)
            assert usage.tokens_in_window == sum(r.charge for r in in_window)
            assert usage.tokens_today == sum(r.charge for r in mine if r.day == utc_day(wall))
            assert usage.tokens_this_month == sum(
                r.charge for r in mine if r.month == utc_month(wall)
            )

    def teardown(self) -> None:
        try:
            for record in self.records:
                if record.endings == 0:
                    assert self.run(self.engine.settle(record.lease, None, None))
                    record.endings = 1
            for scope in ALL_SCOPES:
                assert self.run(self.store.usage(scope)).in_flight == 0
            assert all(r.endings == 1 and not r.lease.active for r in self.records)
            assert self.store.active_leases() == 0
        finally:
            self.run(self.stack.aclose())
            self.loop.close()


def test_quota_machine(quota_store: StoreFactory) -> None:
    class OverThisStore(QuotaMachine):
        make_store = staticmethod(quota_store)

    run_state_machine_as_test(
        OverThisStore,
        settings=settings(max_examples=150, stateful_step_count=60, deadline=None, database=None),
    )
