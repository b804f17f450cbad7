"""`decide` and `rate_limit_status` on their own: pure functions of limits, what each scope
holds, the need and the time. Every store rules with them (the state machine holds both
stores to them); these pin the rules with hand-computed numbers."""

from __future__ import annotations

import math

from serving.gateway.quota import (
    Limits,
    MinuteUsage,
    RateLimitStatus,
    RefusalReason,
    Scope,
    ScopedLimits,
    ScopeState,
    WindowStatus,
    decide,
    rate_limit_status,
)
from tests.gateway.quota.subjects import utc

KEY, MODEL = Scope("key_a"), Scope("key_a", "m")
NOW = 1000.5
WALL = utc(2024, 5, 10, 18)  # six hours before the next UTC day
EMPTY = ScopeState(0, MinuteUsage(0, {}), MinuteUsage(0, {}), 0, 0)


def holding(
    *,
    in_flight: int = 0,
    requests: dict[int, int] | None = None,
    tokens: dict[int, int] | None = None,
    today: int = 0,
    month: int = 0,
) -> ScopeState:
    requests, tokens = requests or {}, tokens or {}
    return ScopeState(
        in_flight,
        MinuteUsage(sum(requests.values()), requests),
        MinuteUsage(sum(tokens.values()), tokens),
        today,
        month,
    )


def test_a_request_that_fits_every_limit_is_admitted() -> None:
    limits = Limits(rpm=2, tpm=100, tokens_per_day=100, tokens_per_month=100, max_concurrency=1)
    state = holding(requests={990: 1}, tokens={990: 40})
    assert decide([ScopedLimits(KEY, limits)], [state], 60, NOW, WALL) is None
    assert (
        decide([ScopedLimits(KEY, Limits())], [holding(in_flight=10**6)], 10**9, NOW, WALL) is None
    )


def test_a_minute_limit_waits_until_enough_of_its_oldest_buckets_have_left() -> None:
    state = holding(requests={950: 1, 990: 1, 1000: 1}, tokens={950: 30, 990: 50, 1000: 10})
    rpm = decide([ScopedLimits(KEY, Limits(rpm=3))], [state], 1, NOW, WALL)
    assert rpm is not None and rpm.reason is RefusalReason.RPM
    assert (rpm.limit, rpm.used, rpm.requested) == (3, 3, 1)
    assert rpm.retry_after == 950 + 61 - NOW  # one request must leave: bucket 950's
    tpm = decide([ScopedLimits(KEY, Limits(tpm=100))], [state], 60, NOW, WALL)
    assert tpm is not None and tpm.reason is RefusalReason.TPM
    assert tpm.retry_after == 990 + 61 - NOW  # 50 must leave: 950's 30 is not enough
    never = decide([ScopedLimits(KEY, Limits(tpm=100))], [EMPTY], 101, NOW, WALL)
    assert never is not None and never.too_large and never.retry_after == math.inf


def test_budgets_wait_for_the_next_utc_day_or_month() -> None:
    state = holding(today=90, month=990)
    limits = Limits(tokens_per_day=100, tokens_per_month=1000)
    refusal = decide([ScopedLimits(KEY, limits)], [state], 20, NOW, WALL)
    assert refusal is not None and refusal.reason is RefusalReason.MONTHLY  # the longer wait
    assert refusal.retry_after == utc(2024, 6, 1) - WALL
    daily = decide([ScopedLimits(KEY, Limits(tokens_per_day=100))], [state], 20, NOW, WALL)
    assert daily is not None and daily.retry_after == 6 * 3600


def test_the_longest_wait_wins_across_scopes_and_ties_go_to_the_more_lasting_reason() -> None:
    scopes = [
        ScopedLimits(KEY, Limits(max_concurrency=1, tokens_per_day=100)),
        ScopedLimits(MODEL, Limits(rpm=1)),
    ]
    states = [holding(in_flight=1, today=100), holding(requests={1000: 1})]
    refusal = decide(scopes, states, 1, NOW, WALL)
    assert refusal is not None and refusal.reason is RefusalReason.DAILY
    assert refusal.scope == KEY
    tie = decide(
        [ScopedLimits(KEY, Limits(rpm=1, tpm=10))],
        [holding(requests={1000: 1}, tokens={1000: 10})],
        5,
        NOW,
        WALL,
    )
    assert tie is not None and tie.reason is RefusalReason.TPM  # same wait: tokens outrank


def test_concurrency_waits_a_second_and_a_zero_limit_forever() -> None:
    busy = decide(
        [ScopedLimits(KEY, Limits(max_concurrency=2))], [holding(in_flight=2)], 1, NOW, WALL
    )
    assert busy is not None and busy.reason is RefusalReason.CONCURRENCY and busy.retry_after == 1
    closed = decide([ScopedLimits(KEY, Limits(max_concurrency=0))], [EMPTY], 1, NOW, WALL)
    assert closed is not None and closed.retry_after == math.inf


def test_the_rate_limit_state_shows_the_scope_with_less_left() -> None:
    scopes = [ScopedLimits(KEY, Limits(rpm=10, tpm=1000)), ScopedLimits(MODEL, Limits(rpm=3))]
    states = [
        holding(requests={960: 1, 995: 1}, tokens={960: 100, 995: 0}),
        holding(requests={995: 2}),
    ]
    status = rate_limit_status(scopes, states, NOW)
    assert status.requests == WindowStatus(3, 1, 995 + 61 - NOW)
    # The newest bucket holding tokens decides when the window is empty again.
    assert status.tokens == WindowStatus(1000, 900, 960 + 61 - NOW)
    assert rate_limit_status([ScopedLimits(KEY, Limits())], [EMPTY], NOW) == RateLimitStatus()
