"""The rate-limit state as Anthropic reports it: `anthropic-ratelimit-{requests,tokens}-*`.

A dimension without a limit gets no headers, as in `headers`. A reset is the RFC 3339 time
(UTC, whole seconds rounded up) at which the window is empty again, where OpenAI's headers
give a duration.
"""

from __future__ import annotations

import math
import time

from serving.gateway.quota.decision import RateLimitStatus
from serving.gateway.quota.headers import Names, window_headers

_NAMES: Names = {
    kind: (f"anthropic-ratelimit-{kind}-limit".encode(),
           f"anthropic-ratelimit-{kind}-remaining".encode(),
           f"anthropic-ratelimit-{kind}-reset".encode())
    for kind in ("requests", "tokens")
}  # fmt: skip


def rfc3339(epoch_s: float) -> bytes:
    """`epoch_s` rounded up to the second, as `2026-12-07T19:45:03Z`."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(math.ceil(epoch_s))).encode()


def anthropic_rate_limit_headers(
    status: RateLimitStatus, now: float | None = None
) -> list[tuple[bytes, bytes]]:
    """The headers for `status`, its resets counted from `now` (the wall clock's epoch
    seconds; default: now)."""
    wall = time.time() if now is None else now
    return window_headers(status, _NAMES, lambda after: rfc3339(wall + max(after, 0.0)))
