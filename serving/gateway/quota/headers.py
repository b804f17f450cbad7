"""The rate-limit state as OpenAI reports it: `x-ratelimit-{limit,remaining,reset}-*`.

A dimension without a limit gets no headers (there is nothing true to say). Resets are in
OpenAI's (Go's) duration format.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from serving.gateway.quota.decision import RateLimitStatus


def format_reset(seconds: float) -> str:
    """OpenAI's (Go's) duration format: `20ms`, `1s`, `1.5s`, `6m0s`, `1h0m0s`.

    Rounded up to the millisecond: a client that waits exactly this long finds room again.
    """
    if seconds <= 0:
        return "0s"
    # Less a nanosecond first, so float noise (0.1 * 1000 = 100.00000000000001) does not add
    # 1 ms.
    millis = math.ceil(seconds * 1000 - 1e-6)
    if millis < 1000:
        return f"{millis}ms"
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    whole, fraction = divmod(millis, 1000)
    secs = f"{whole}.{fraction:03d}".rstrip("0") if fraction else str(whole)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


# `format_reset` as header bytes, by whole milliseconds: a minute window's resets are at most
# 61,000 distinct values, and formatting one costs more than the rest of the headers.
_RESET_CACHE_SIZE = 65_536
_reset_values: dict[int, bytes] = {}


def _reset_value(seconds: float) -> bytes:
    millis = math.ceil(seconds * 1000 - 1e-6) if seconds > 0 else 0
    value = _reset_values.get(millis)
    if value is None:
        value = format_reset(millis / 1000).encode() if millis else b"0s"
        if len(_reset_values) >= _RESET_CACHE_SIZE:
            _reset_values.clear()
        _reset_values[millis] = value
    return value


def rate_limit_headers(status: RateLimitStatus) -> dict[str, str]:
    headers: dict[str, str] = {}
    for name, window in (("requests", status.requests), ("tokens", status.tokens)):
        if window is None:
            continue
        headers[f"x-ratelimit-limit-{name}"] = str(window.limit)
        headers[f"x-ratelimit-remaining-{name}"] = str(window.remaining)
        headers[f"x-ratelimit-reset-{name}"] = format_reset(window.reset_after)
    return headers


Names = dict[str, tuple[bytes, bytes, bytes]]
_RAW_NAMES: Names = {
    kind: (f"x-ratelimit-limit-{kind}".encode(), f"x-ratelimit-remaining-{kind}".encode(),
           f"x-ratelimit-reset-{kind}".encode())
    for kind in ("requests", "tokens")
}  # fmt: skip


def rate_limit_raw_headers(status: RateLimitStatus) -> list[tuple[bytes, bytes]]:
    """`rate_limit_headers` as ASGI header pairs, built directly (once per request)."""
    return window_headers(status, _RAW_NAMES, _reset_value)


def window_headers(
    status: RateLimitStatus,
    names: Names,
    reset: Callable[[float], bytes],
) -> list[tuple[bytes, bytes]]:
    """Each limited window's (limit, remaining, reset) header pairs, named by `names[kind]`
    (kind "requests" or "tokens"), the reset written by `reset` from the seconds left."""
    headers: list[tuple[bytes, bytes]] = []
    for kind, window in (("requests", status.requests), ("tokens", status.tokens)):
        if window is not None:
            limit, remaining, reset_name = names[kind]
            headers.append((limit, b"%d" % window.limit))
            headers.append((remaining, b"%d" % window.remaining))
            headers.append((reset_name, reset(window.reset_after)))
    return headers
