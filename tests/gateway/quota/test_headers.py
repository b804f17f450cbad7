"""The rate-limit state as OpenAI's x-ratelimit-* headers."""

import pytest

from serving.gateway.quota import RateLimitStatus, WindowStatus, format_reset, rate_limit_headers


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [
        (0, "0s"),
        (-3, "0s"),
        (0.0001, "1ms"),
        (0.02, "20ms"),
        (0.1, "100ms"),
        (1, "1s"),
        (1.5, "1.5s"),
        (6.25, "6.25s"),
        (59.9996, "1m0s"),
        (61, "1m1s"),
        (360, "6m0s"),
        (3600, "1h0m0s"),
        (3723.5, "1h2m3.5s"),
    ],
)
def test_reset_uses_openai_duration_format(seconds: float, expected: str) -> None:
    assert format_reset(seconds) == expected


def test_headers_for_both_dimensions() -> None:
    status = RateLimitStatus(
        requests=WindowStatus(limit=60, remaining=59, reset_after=1.0),
        tokens=WindowStatus(limit=150_000, remaining=149_984, reset_after=0.006),
    )
    assert rate_limit_headers(status) == {
        "x-ratelimit-limit-requests": "60",
        "x-ratelimit-remaining-requests": "59",
        "x-ratelimit-reset-requests": "1s",
        "x-ratelimit-limit-tokens": "150000",
        "x-ratelimit-remaining-tokens": "149984",
        "x-ratelimit-reset-tokens": "6ms",
    }


def test_unlimited_dimension_has_no_headers() -> None:
    status = RateLimitStatus(requests=WindowStatus(10, 0, 61.0))
    assert rate_limit_headers(status) == {
        "x-ratelimit-limit-requests": "10",
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "1m1s",
    }
    assert rate_limit_headers(RateLimitStatus()) == {}
