"""Anthropic's Messages API through the gateway, as the official `anthropic` client sees it
(against the fake upstream): metered like chat, count_tokens free, errors and rate-limit
headers in Anthropic's words, `x-api-key` accepted."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import pytest

from serving.gateway.keys import SqliteKeyStore
from serving.gateway.keys.record import KeySpec
from serving.gateway.openai_request import parse_completion_request
from serving.gateway.quota import Limits
from tests.gateway.conftest import GatewayFactory
from tests.gateway.fake_bodies import WORDS
from tests.gateway.fake_messages import ECHO_WORDS, PROMPT_TOKENS
from tests.gateway.fake_upstream import FakeUpstream
from tests.gateway.scrape import key_usage, settled
from tests.gateway.servers import TEST_KEY, GatewayServer, closed_port, http_client

pytestmark = pytest.mark.timeout(30)

ASK: list[anthropic.types.MessageParam] = [{"role": "user", "content": "hi"}]
ESTIMATE = parse_completion_request(
    "messages", json.dumps({"model": "fake", "max_tokens": 1, "messages": ASK}).encode()
).prompt_estimate


def client(gateway: GatewayServer, secret: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key=secret, max_retries=0, timeout=10)


@pytest.fixture
def metered(make_gateway: GatewayFactory, keys: SqliteKeyStore) -> tuple[GatewayServer, str, str]:
    """A gateway with a key store, and a key limited to 10 requests a minute."""
    gateway = make_gateway(keys_db=str(keys.path))
    record, secret = keys.create(KeySpec("agent", limits=Limits(rpm=10, tpm=100_000)))
    return gateway, record.key_id, secret


def charged(gateway: GatewayServer, key_id: str) -> int:
    assert settled(gateway)
    return key_usage(gateway, key_id)[3]


def test_a_message_is_charged_vllms_usage_with_its_cache_fields(
    metered: tuple[GatewayServer, str, str],
) -> None:
    gateway, key_id, secret = metered
    with client(gateway, secret) as api:
        raw = api.messages.with_raw_response.create(model="fake", max_tokens=50, messages=ASK)
    reply = raw.parse()
    assert reply.content[0].type == "text" and reply.content[0].text == "".join(WORDS)
    # input 2 + cache_read 1 (the prompt vLLM counted) + 4 generated
    assert charged(gateway, key_id) == PROMPT_TOKENS + len(WORDS)
    assert raw.headers["anthropic-ratelimit-requests-limit"] == "10"
    assert raw.headers["anthropic-ratelimit-requests-remaining"] == "9"
    assert raw.headers["anthropic-ratelimit-requests-reset"].endswith("Z")
    assert raw.headers["x-ratelimit-limit-requests"] == "10"  # the gateway's own, beside


def test_a_stream_is_charged_its_final_usage(metered: tuple[GatewayServer, str, str]) -> None:
    gateway, key_id, secret = metered
    with (
        client(gateway, secret) as api,
        api.messages.stream(model="fake", max_tokens=50, messages=ASK) as stream,
    ):
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "".join(WORDS)
    assert final.usage.output_tokens == len(WORDS)
    assert charged(gateway, key_id) == PROMPT_TOKENS + len(WORDS)


def test_usage_echoed_in_the_text_is_never_read_as_usage(
    metered: tuple[GatewayServer, str, str],
) -> None:
    gateway, key_id, secret = metered
    with (
        client(gateway, secret) as api,
        api.messages.stream(model="fault-echo", max_tokens=50, messages=ASK) as stream,
    ):
        assert "".join(stream.text_stream) == "".join(ECHO_WORDS)
    assert charged(gateway, key_id) == PROMPT_TOKENS + len(ECHO_WORDS)


def test_a_cut_stream_is_charged_the_prompt_vllm_counted_and_a_bound_of_its_text(
    metered: tuple[GatewayServer, str, str],
) -> None:
    gateway, key_id, secret = metered
    with http_client(gateway.url, key=secret) as http:
        body = {"model": "fault-reset", "max_tokens": 500, "stream": True, "messages": ASK}
        response = http.post("/v1/messages", json=body)
    assert response.status_code == 200
    events = response.text.split("\n\n")
    # The stream ends with Anthropic's error event, never a fake message_stop.
    assert events[-2].startswith("event: error\ndata: ")
    error = json.loads(events[-2].split("data: ", 1)[1])
    assert error["type"] == "error" and error["error"]["type"] == "api_error"
    assert "message_stop" not in response.text
    # message_start's prompt (3), and the bytes of the two deltas read plus one per event
    # and the textless allowance: far under the 500 reserved.
    spent = charged(gateway, key_id)
    assert PROMPT_TOKENS + 2 <= spent < PROMPT_TOKENS + 50


def test_an_in_band_error_passes_through_and_is_charged_by_the_bound(
    metered: tuple[GatewayServer, str, str],
) -> None:
    gateway, key_id, secret = metered
    with http_client(gateway.url, key=secret) as http:
        body = {"model": "fault-in-band", "max_tokens": 500, "stream": True, "messages": ASK}
        response = http.post("/v1/messages", json=body)
    assert 'event: error\ndata: {"type":"error","error":{"type":"internal_error"' in response.text
    assert PROMPT_TOKENS + 2 <= charged(gateway, key_id) < PROMPT_TOKENS + 50


def test_at_its_limit_a_key_gets_anthropics_429(
    make_gateway: GatewayFactory, keys: SqliteKeyStore, upstream: FakeUpstream, token: str
) -> None:
    gateway = make_gateway(keys_db=str(keys.path))
    _, secret = keys.create(KeySpec("tpm", limits=Limits(tpm=ESTIMATE + 60)))
    with client(gateway, secret) as api:
        api.messages.create(model="fake", max_tokens=50, messages=ASK)  # charged 3 + 4
        assert settled(gateway)
        with pytest.raises(anthropic.RateLimitError) as caught:
            api.messages.create(model="fake", max_tokens=60, messages=ASK, extra_query={"t": token})
    assert not upstream.received(token)
    error = caught.value
    assert error.status_code == 429
    assert error.body == {"type": "error", "error": {"type": "rate_limit_error", "message": ANY}}
    headers = error.response.headers
    assert int(headers["retry-after"]) >= 1
    assert headers["anthropic-ratelimit-tokens-limit"] == str(ESTIMATE + 60)
    remaining = ESTIMATE + 60 - (PROMPT_TOKENS + len(WORDS))
    assert headers["anthropic-ratelimit-tokens-remaining"] == str(remaining)


def test_count_tokens_is_free_and_checked_like_a_message(
    metered: tuple[GatewayServer, str, str], upstream: FakeUpstream, token: str
) -> None:
    gateway, key_id, secret = metered
    with client(gateway, secret) as api:
        counted = api.messages.count_tokens(model="fake", messages=ASK, extra_query={"t": token})
        assert counted.input_tokens == 7
        remote: Any = {"type": "image", "source": {"type": "url", "url": "http://169.254.169.254/"}}
        with pytest.raises(anthropic.BadRequestError) as caught:
            api.messages.count_tokens(
                model="fake", messages=[{"role": "user", "content": [remote]}]
            )
    assert caught.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert "messages[0].content[0].source" in caught.value.message
    assert [body["messages"] for body in upstream.received(token)] == [ASK]
    assert charged(gateway, key_id) == 0


def test_x_api_key_is_a_credential_and_never_reaches_the_engine(
    metered: tuple[GatewayServer, str, str], upstream: FakeUpstream, token: str
) -> None:
    gateway, _, secret = metered
    body = {"model": "fake", "max_tokens": 5, "messages": ASK}
    with http_client(gateway.url, key=None) as http:
        ok = http.post(f"/v1/messages?t={token}", json=body, headers={"x-api-key": secret})
        wrong = http.post("/v1/messages", json=body, headers={"x-api-key": "sk-wrong"})
        # only Anthropic's routes read it
        chat = {"model": "fake", "messages": ASK}
        openai_route = http.post("/v1/chat/completions", json=chat, headers={"x-api-key": secret})
    assert ok.status_code == 200, ok.text
    assert wrong.status_code == 401
    assert wrong.json() == {
        "type": "error",
        "error": {"type": "authentication_error", "message": ANY},
    }
    assert "x-api-key" in wrong.json()["error"]["message"]
    assert openai_route.status_code == 401 and "error" in openai_route.json()
    echo = _echoed_headers(gateway, secret)
    assert "x-api-key" not in echo and "anthropic-version" not in echo


@pytest.mark.parametrize(
    ("path", "body", "status", "kind"),
    [
        ("/v1/messages/render", {}, 403, "permission_error"),
        ("/v1/messages", {"model": "fake", "messages": ASK}, 400, "invalid_request_error"),
        ("/v1/messages", {"model": "nope", "max_tokens": 5, "messages": ASK}, 404, None),
        (
            "/v1/messages",
            {"model": "fault-context", "max_tokens": 5, "messages": ASK},
            400,
            "invalid_request_error",
        ),
    ],
)
def test_errors_on_anthropics_paths_are_in_its_shape(
    make_gateway: GatewayFactory,
    keys: SqliteKeyStore,
    path: str,
    body: dict[str, Any],
    status: int,
    kind: str | None,
) -> None:
    gateway = make_gateway(keys_db=str(keys.path))
    _, secret = keys.create(KeySpec("models", models=("fake", "fault-context")))
    with http_client(gateway.url, key=secret) as http:
        response = http.post(path, json=body)
    assert response.status_code == status, response.text
    error = response.json()
    assert error["type"] == "error" and set(error["error"]) == {"type", "message"}
    assert error["error"]["type"] == (kind or "not_found_error")


def test_no_engine_is_anthropics_overload_with_retry_after(make_gateway: GatewayFactory) -> None:
    gateway = make_gateway(upstream=f"http://127.0.0.1:{closed_port()}")
    with client(gateway, TEST_KEY) as api, pytest.raises(anthropic.APIStatusError) as caught:
        api.messages.create(model="fake", max_tokens=5, messages=ASK)
    assert isinstance(caught.value, anthropic.InternalServerError)
    assert caught.value.status_code == 529
    assert caught.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]
    assert int(caught.value.response.headers["retry-after"]) >= 1


def _echoed_headers(gateway: GatewayServer, secret: str) -> set[str]:
    """The request headers an engine gets from a Messages client (through /v1/echo, which
    the test route table serves free)."""
    headers = {"x-api-key": secret, "anthropic-version": "2023-06-01", "anthropic-beta": "x"}
    with http_client(gateway.url, key=secret) as http:
        described = http.post("/v1/echo", json={}, headers=headers).json()
    return {name for name, _ in described["headers"]}


class _Any:
    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and bool(other)


ANY: Any = _Any()
