"""The rate-limit state as Anthropic names it, with resets as RFC 3339 times."""

from __future__ import annotations

from datetime import UTC, datetime

from serving.gateway.quota import RateLimitStatus
from serving.gateway.quota.anthropic_headers import anthropic_rate_limit_headers, rfc3339
from serving.gateway.quota.decision import WindowStatus

NOW = datetime(2026, 12, 7, 19, 45, 0, tzinfo=UTC).timestamp()


def test_each_limited_dimension_gets_its_three_headers() -> None:
    status = RateLimitStatus(requests=WindowStatus(60, 59, 0.2), tokens=WindowStatus(1000, 7, 59.5))
    assert anthropic_rate_limit_headers(status, NOW) == [
        (b"anthropic-ratelimit-requests-limit", b"60"),
        (b"anthropic-ratelimit-requests-remaining", b"59"),
        (b"anthropic-ratelimit-requests-reset", b"2026-12-07T19:45:01Z"),
        (b"anthropic-ratelimit-tokens-limit", b"1000"),
        (b"anthropic-ratelimit-tokens-remaining", b"7"),
        (b"anthropic-ratelimit-tokens-reset", b"2026-12-07T19:46:00Z"),
    ]


def test_no_limit_no_headers() -> None:
    assert anthropic_rate_limit_headers(RateLimitStatus(), NOW) == []
    tokens_only = RateLimitStatus(tokens=WindowStatus(5, 5, 0.0))
    names = [name for name, _ in anthropic_rate_limit_headers(tokens_only, NOW)]
    assert names == [
        b"anthropic-ratelimit-tokens-limit",
        b"anthropic-ratelimit-tokens-remaining",
        b"anthropic-ratelimit-tokens-reset",
    ]


def test_a_reset_rounds_up_so_waiting_until_it_finds_room() -> None:
    assert rfc3339(NOW) == b"2026-12-07T19:45:00Z"
    assert rfc3339(NOW + 0.001) == b"2026-12-07T19:45:01Z"
    parsed = datetime.fromisoformat(rfc3339(NOW + 61.2).decode())
    assert parsed.timestamp() == NOW + 62
