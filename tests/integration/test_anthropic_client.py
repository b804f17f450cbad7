"""The official `anthropic` client against the gateway in front of real vLLM on the tiny model
(the session's stack): Messages answered and streamed, tool use, count_tokens, a limited key
charged exactly vLLM's count and refused at its limit in Anthropic's shape, a cut stream
charged by the rules. The accounting oracle checks every test against vLLM's counters."""

from __future__ import annotations

import time

import anthropic
import httpx
import pytest

from tests.integration.conftest import MODEL, Stack, eventually, scrape, total
from tests.integration.oracle import read_ledger
from tests.integration.test_gateway_quota import charged, create_key, idle

ASK: list[anthropic.types.MessageParam] = [
    {"role": "user", "content": "Tell me about the weather."}
]
# The tiny model follows no instructions: vLLM's grammar holds a forced call to the schema,
# which an enum and no extra properties keep short.
TOOLS: list[anthropic.types.ToolParam] = [
    {
        "name": "get_weather",
        "description": "The weather in a city.",
        "input_schema": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo", "Lima"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    }
]
# A string the grammar holds open past any max_tokens below: a long stream to cut.
NOTE: list[anthropic.types.ToolParam] = [
    {
        "name": "take_note",
        "input_schema": {
            "type": "object",
            "properties": {"note": {"type": "string", "minLength": 6000}},
            "required": ["note"],
        },
    }
]
ONE_CALL: anthropic.types.ToolChoiceAnyParam = {"type": "any", "disable_parallel_tool_use": True}


# Anthropic's `temperature` (vLLM reads it; this client version does not name it).
GREEDY = {"temperature": 0}


def client(stack: Stack, secret: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=stack.gateway_url, api_key=secret, max_retries=0)


def engine_counts(stack: Stack) -> tuple[float, float]:
    samples = scrape(stack.engine_url)
    prompt = total(samples, "vllm:prompt_tokens_total")
    return prompt, total(samples, "vllm:generation_tokens_total")


def test_messages_are_charged_exactly_vllms_count_and_move_the_headers(stack: Stack) -> None:
    key_id, secret = create_key(stack, "anthropic-sdk", "--rpm", "100", "--tpm", "100000")
    eventually(lambda: idle(stack))
    prompt_before, generated_before = engine_counts(stack)
    with client(stack, secret) as api:
        raw = api.messages.with_raw_response.create(
            model=MODEL, max_tokens=16, messages=ASK, extra_body=GREEDY
        )
        reply = raw.parse()
        with api.messages.stream(
            model=MODEL, max_tokens=16, messages=ASK, system="Be brief.", extra_body=GREEDY
        ) as stream:
            streamed = "".join(stream.text_stream)
            final = stream.get_final_message()
        again = api.messages.with_raw_response.create(model=MODEL, max_tokens=2, messages=ASK)
    assert reply.role == "assistant" and reply.content and reply.content[0].type == "text"
    assert 0 < reply.usage.output_tokens <= 16 and reply.usage.input_tokens > 5
    assert streamed == "".join(b.text for b in final.content if b.type == "text")
    assert 0 < final.usage.output_tokens <= 16
    # requests/min: 100, one used before each answer's headers were written
    assert raw.headers["anthropic-ratelimit-requests-limit"] == "100"
    assert raw.headers["anthropic-ratelimit-requests-remaining"] == "99"
    assert again.headers["anthropic-ratelimit-requests-remaining"] == "97"
    assert int(again.headers["anthropic-ratelimit-tokens-remaining"]) < int(
        raw.headers["anthropic-ratelimit-tokens-remaining"]
    )
    last = again.parse()
    answers = (reply, final, last)
    # vLLM's prompt count is the input and what its prefix cache held, when it says so
    prompt_tokens = sum(
        answer.usage.input_tokens
        + (answer.usage.cache_read_input_tokens or 0)
        + (answer.usage.cache_creation_input_tokens or 0)
        for answer in answers
    )
    output_tokens = sum(answer.usage.output_tokens for answer in answers)
    eventually(lambda: idle(stack))
    # vLLM's counters move a moment after the last byte went out: wait for them
    expected = (prompt_before + prompt_tokens, generated_before + output_tokens)
    eventually(lambda: engine_counts(stack) == expected)
    assert charged(stack, key_id, "prompt") == prompt_tokens
    assert charged(stack, key_id, "completion") == output_tokens


def test_tool_use_goes_round_trip(stack: Stack) -> None:
    _, secret = create_key(stack, "anthropic-tools")
    with client(stack, secret) as api:
        first = api.messages.create(
            model=MODEL, max_tokens=120, messages=ASK, tools=TOOLS, tool_choice=ONE_CALL,
            extra_body=GREEDY,
        )  # fmt: skip
        calls = [block for block in first.content if block.type == "tool_use"]
        assert first.stop_reason == "tool_use" and calls
        assert calls[0].name == "get_weather"
        assert calls[0].input in ({"city": "Paris"}, {"city": "Tokyo"}, {"city": "Lima"})
        result: anthropic.types.ToolResultBlockParam = {
            "type": "tool_result", "tool_use_id": calls[0].id, "content": "Sunny, 21 C",
        }  # fmt: skip
        turns: list[anthropic.types.MessageParam] = [
            *ASK,
            {"role": "assistant", "content": first.content},
            {"role": "user", "content": [result]},
        ]
        second = api.messages.create(
            model=MODEL, max_tokens=8, messages=turns, tools=TOOLS, extra_body=GREEDY,
            tool_choice={"type": "none"},
        )  # fmt: skip
        counted = api.messages.count_tokens(
            model=MODEL, messages=turns, tools=TOOLS, tool_choice={"type": "none"}
        )
    assert second.stop_reason in ("end_turn", "max_tokens")
    # count_tokens is vLLM's own tokenization of the same prompt
    assert counted.input_tokens == second.usage.input_tokens


def test_count_tokens_is_free(stack: Stack) -> None:
    key_id, secret = create_key(stack, "anthropic-count")
    with client(stack, secret) as api:
        counted = api.messages.count_tokens(model=MODEL, messages=ASK, system="Be brief.")
    assert counted.input_tokens > 5
    eventually(lambda: idle(stack))
    assert charged(stack, key_id, "prompt") == charged(stack, key_id, "completion") == 0


def test_a_key_at_its_limit_gets_anthropics_429(stack: Stack) -> None:
    _, secret = create_key(stack, "anthropic-429", "--rpm", "1")
    with client(stack, secret) as api:
        api.messages.create(model=MODEL, max_tokens=2, messages=ASK)
        with pytest.raises(anthropic.RateLimitError) as caught:
            api.messages.create(model=MODEL, max_tokens=2, messages=ASK)
    error = caught.value
    assert error.body == {
        "type": "error",
        "error": {"type": "rate_limit_error", "message": error.body["error"]["message"]},  # type: ignore[index]
    }
    assert int(error.response.headers["retry-after"]) >= 1
    assert error.response.headers["anthropic-ratelimit-requests-remaining"] == "0"
    # x-api-key, as other Anthropic clients send the key: the same key, the same refusal
    response = httpx.post(
        f"{stack.gateway_url}/v1/messages",
        json={"model": MODEL, "max_tokens": 2, "messages": ASK},
        headers={"x-api-key": secret, "anthropic-version": "2023-06-01"},
        timeout=30,
    )
    assert response.status_code == 429
    assert response.json()["error"]["type"] == "rate_limit_error"


def test_a_cut_stream_is_charged_at_least_what_vllm_counted(stack: Stack) -> None:
    key_id, secret = create_key(stack, "anthropic-cut")
    eventually(lambda: idle(stack))
    before = read_ledger(stack.gateway_url, stack.engine_url)
    body = {"model": MODEL, "max_tokens": 1500, "stream": True, "temperature": 0,
            "messages": ASK, "tools": NOTE, "tool_choice": ONE_CALL}  # fmt: skip
    read = 0
    with (
        httpx.Client(timeout=120) as http,
        http.stream("POST", f"{stack.gateway_url}/v1/messages", json=body,
                    headers={"x-api-key": secret}) as response,
    ):  # fmt: skip
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("event: content_block_delta"):  # the note's arguments
                read += 1
                time.sleep(0.2)  # vLLM runs ahead and merges tokens into fewer events
            if read >= 6:
                break
    eventually(lambda: idle(stack))
    after = read_ledger(stack.gateway_url, stack.engine_url)
    counted = after.engine_tokens - before.engine_tokens
    spent = charged(stack, key_id, "prompt") + charged(stack, key_id, "completion")
    cut = after.cut - before.cut
    print(
        f"messages cut ({cut}): vLLM counted {counted}, charged {spent}"
    )  # the slack's calibration
    assert counted > 0 and spent == after.charged - before.charged
    assert cut in (0, 1)  # by a bound, or vLLM finished while drained
    assert after.shortfall(before) <= 0
