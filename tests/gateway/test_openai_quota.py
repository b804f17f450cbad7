"""Quota refusals as the official `openai` client sees them.

A stream that would cross tokens/min is refused up front (never cut), the key works again
once the window has passed (a manual clock stands in for the minute), a spent daily budget is
`insufficient_quota`, and the client honours `Retry-After` when it may retry.
"""

from __future__ import annotations

import json
import threading
import time

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from serving.gateway.keys import SqliteKeyStore
from serving.gateway.keys.record import KeySpec
from serving.gateway.openai_request import parse_completion_request
from serving.gateway.quota import Limits, ManualClock
from tests.gateway.conftest import GatewayFactory
from tests.gateway.fake_upstream import FakeUpstream
from tests.gateway.scrape import scrape, settled, value
from tests.gateway.servers import GatewayServer

pytestmark = pytest.mark.timeout(30)

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
ESTIMATE = parse_completion_request(
    "chat", json.dumps({"model": "fake", "messages": MESSAGES}).encode()
).prompt_estimate


def client(gateway: GatewayServer, secret: str, *, max_retries: int = 0) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=gateway.url + "/v1", api_key=secret, max_retries=max_retries, timeout=10
    )


def stream_text(api: openai.OpenAI, max_tokens: int, token: str = "-") -> str:
    stream = api.chat.completions.create(
        model="fake", messages=MESSAGES, max_tokens=max_tokens, stream=True,
        extra_query={"t": token},
    )  # fmt: skip
    return "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)


def test_stream_over_tokens_per_minute_is_refused_up_front_then_allowed_after_the_window(
    make_gateway: GatewayFactory, keys: SqliteKeyStore, upstream: FakeUpstream, token: str
) -> None:
    clock = ManualClock()
    gateway = make_gateway(keys_db=str(keys.path), clock=clock)
    _, secret = keys.create(KeySpec("tpm", limits=Limits(tpm=ESTIMATE + 90)))
    with client(gateway, secret) as api:
        assert stream_text(api, 50) == "one two three four"  # reserves 50, charged 3 + 4
        # The client has [DONE] before the gateway's handler settles the request (a busy
        # machine let the next request see the whole reservation still held).
        assert settled(gateway)
        with pytest.raises(openai.RateLimitError) as caught:
            stream_text(api, 85, token)
        assert not upstream.received(token)  # refused before it started, not cut
        error = caught.value
        assert error.status_code == 429
        assert (error.type, error.code) == ("tokens", "rate_limit_exceeded")
        headers = error.response.headers
        assert int(headers["retry-after"]) == 61  # the minute the first request is in
        assert headers["x-ratelimit-limit-tokens"] == str(ESTIMATE + 90)
        assert int(headers["x-ratelimit-remaining-tokens"]) == ESTIMATE + 90 - (3 + 4)
        clock.advance(61)
        assert stream_text(api, 85, token) == "one two three four"
    assert settled(gateway)


def test_spent_daily_budget_is_insufficient_quota(
    make_gateway: GatewayFactory, keys: SqliteKeyStore
) -> None:
    clock = ManualClock()
    gateway = make_gateway(keys_db=str(keys.path), clock=clock)
    record, secret = keys.create(KeySpec("budget", limits=Limits(tokens_per_day=ESTIMATE + 12)))
    with client(gateway, secret) as api:
        reply = api.chat.completions.create(model="fake", messages=MESSAGES, max_tokens=12)
        assert reply.usage is not None and reply.usage.total_tokens == 5
        clock.advance(61)  # a new minute does not refill a day
        with pytest.raises(openai.RateLimitError) as caught:
            api.chat.completions.create(model="fake", messages=MESSAGES, max_tokens=12)
    assert (caught.value.type, caught.value.code) == ("insufficient_quota", "insufficient_quota")
    assert "tokens per day" in caught.value.message
    samples = scrape(gateway)
    assert value(samples, "gateway_quota_rejections_total", key=record.key_id, reason="daily")


def test_client_honours_retry_after_for_a_busy_key(
    make_gateway: GatewayFactory, keys: SqliteKeyStore, upstream: FakeUpstream, token: str
) -> None:
    gateway = make_gateway(keys_db=str(keys.path))
    record, secret = keys.create(KeySpec("one-at-a-time", limits=Limits(max_concurrency=1)))
    holder_done: list[str] = []

    def hold() -> None:
        with client(gateway, secret) as api:
            reply = api.chat.completions.create(
                model="gated", messages=MESSAGES, max_tokens=3, extra_query={"t": token}
            )
            holder_done.append(reply.choices[0].message.content or "")

    holder = threading.Thread(target=hold)
    holder.start()
    assert upstream.wait_for(f"{token}:started", 5)
    threading.Timer(0.3, upstream.release, args=(token,)).start()
    started = time.monotonic()
    with client(gateway, secret, max_retries=1) as api:
        reply = api.chat.completions.create(model="fake", messages=MESSAGES, max_tokens=3)
    waited = time.monotonic() - started
    holder.join(5)
    assert reply.choices[0].message.content == "hello there"
    assert holder_done == ["hello there"]
    assert 0.9 <= waited < 5  # the 429 said retry-after-ms: 1000, and the client waited
    samples = scrape(gateway)
    assert (
        value(samples, "gateway_quota_rejections_total", key=record.key_id, reason="concurrency")
        == 1
    )
    assert settled(gateway)
