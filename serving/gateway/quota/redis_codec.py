"""The Redis store's wire format: store values as script arguments, script replies as store
values (`lua/common.lua` and each script's header say what they send and expect).

    args += [scope_name(scope), *limit_args(limits)]     # a scope and its limits
    head, states = read_head(reply[0]), [read_state(raw) for raw in reply[1:]]

Numbers travel as decimal strings (Lua hands floats back formatted, and '' is "no limit");
scope names are quoted, so model names holding ':' or braces cannot clash with the layout.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, NamedTuple
from urllib.parse import quote

from serving.gateway.quota.decision import Lease, LeaseState, MinuteUsage, ScopeState
from serving.gateway.quota.limits import Limits, Scope

_ENDINGS = {"expired": LeaseState.EXPIRED, "cancelled": LeaseState.FAILED}


class Head(NamedTuple):
    """The clock and calendar a script ran at."""

    now: float
    wall: float
    bucket: int
    day: str
    month: str


@functools.lru_cache(maxsize=4096)  # a model name is quoted once, not per request
def scope_name(scope: Scope) -> str:
    return "k" if scope.model is None else "m:" + quote(scope.model, safe="")


def limit_args(limits: Limits) -> list[str]:
    """In the order the reserve script reads them; '' is no limit."""
    values = (
        limits.max_concurrency,
        limits.rpm,
        limits.tpm,
        limits.tokens_per_day,
        limits.tokens_per_month,
    )
    return ["" if value is None else str(value) for value in values]


def read_head(raw: Sequence[Any]) -> Head:
    """{now, wall, bucket, day, month}, as the reserve and snapshot scripts send it."""
    return Head(float(raw[0]), float(raw[1]), int(raw[2]), str(raw[3]), str(raw[4]))


def _buckets(flat: Sequence[Any]) -> dict[int, int]:
    # Oldest first, as the script sorted them.
    return {int(flat[index]): int(flat[index + 1]) for index in range(0, len(flat), 2)}


def read_state(raw: Sequence[Any]) -> ScopeState:
    """A scope's counters, as common.lua's `state_reply` sends them."""
    in_flight, today, month, requests, request_buckets, tokens, token_buckets = raw
    return ScopeState(
        int(in_flight),
        MinuteUsage(int(requests), _buckets(request_buckets)),
        MinuteUsage(int(tokens), _buckets(token_buckets)),
        int(today),
        int(month),
    )


def booked(bucket: int, requests: int, tokens: int) -> ScopeState:
    """A scope's minute windows right after an admission was booked in `bucket`: that is
    then the newest bucket holding something, which is all `window_reset` reads."""
    return ScopeState(
        0, MinuteUsage(requests, {bucket: requests}), MinuteUsage(tokens, {bucket: tokens}), 0, 0
    )


def learn_ending(lease: Lease, ending: str | None) -> None:
    """Record on `lease` how it ended elsewhere, when Redis still knows."""
    if ending is None:
        return
    kind, _, tokens = ending.partition(":")
    lease.state, lease.charged_tokens = _ENDINGS[kind], int(tokens)
