"""Tool calls, structured outputs and reasoning through the gateway, as the OpenAI SDK sends
them, on the real engine (the session `stack`, profile cpu-tiny: hermes tool parser, qwen3
reasoning parser, compact-JSON grammars).

The tiny model follows no instructions, so what is checked is what the serving stack
guarantees: vLLM's grammar holds forced tool calls and `response_format` to their schemas (the
answers validate with jsonschema, streamed ones reassemble to the same), the qwen3 parser
splits thinking from the answer, and the gateway meters all of it like any other tokens.

Reasoning: the tiny model never learned to think, so the test makes it think the way Qwen3
deployments bound thinking: `enable_thinking` opens `<think>` in the prompt (the chat
template), and vLLM's `thinking_token_budget` ends the thinking with `</think>` after a few
tokens. What follows is the answer, held to the JSON schema once reasoning ended. The parser
then meets a real `<think>...</think>` output, streamed and not (a second model trained to
think would cost a build and an engine start in every `make test`, for the same check).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import httpx
import jsonschema  # type: ignore[import-untyped]
import pytest
from openai import BadRequestError
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from serving.gateway.openai_request import parse_completion_request
from tests.integration.conftest import MODEL, Stack, eventually
from tests.integration.test_gateway_quota import charged, client, create_key

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Tokyo", "Lima"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"zone": {"type": "string", "maxLength": 12}},
    "required": ["zone"],
    "additionalProperties": False,
}
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {"name": name, "description": f"{name} for a place", "parameters": schema},
    }
    for name, schema in SCHEMAS.items()
]
ASK: list[Any] = [{"role": "user", "content": "What is the weather in Paris this week?"}]
ANSWER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 16},
        "sunny": {"type": "boolean"},
    },
    "required": ["city", "sunny"],
    "additionalProperties": False,
}
RESPONSE_FORMAT: Any = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}}
THINK: dict[str, Any] = {
    "chat_template_kwargs": {"enable_thinking": True},
    "thinking_token_budget": 6,
}


def check_calls(calls: list[tuple[str, str]]) -> None:
    """Each (name, arguments) names a tool and its arguments are JSON that fits its schema."""
    assert calls, "no tool call"
    for name, arguments in calls:
        jsonschema.validate(json.loads(arguments), SCHEMAS[name])


def calls_of(response: ChatCompletion) -> list[tuple[str, str]]:
    return [
        (call.function.name, call.function.arguments)
        for call in response.choices[0].message.tool_calls or []
        if call.type == "function"
    ]


def reassembled_calls(chunks: Iterable[ChatCompletionChunk]) -> tuple[list[tuple[str, str]], str]:
    """The tool calls a stream's deltas add up to (by index), and its finish reason."""
    calls: dict[int, list[str]] = {}
    ids: dict[int, str] = {}
    finish = ""
    for chunk in chunks:
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                name, arguments = calls.setdefault(delta.index, ["", ""])
                if delta.id:
                    assert ids.setdefault(delta.index, delta.id) == delta.id  # one id a call
                if delta.function is not None:
                    calls[delta.index] = [
                        name + (delta.function.name or ""),
                        arguments + (delta.function.arguments or ""),
                    ]
            finish = choice.finish_reason or finish
    assert set(ids) == set(calls), "a streamed tool call without an id"
    return [(name, arguments) for _, (name, arguments) in sorted(calls.items())], finish


def estimate(body: dict[str, Any]) -> int:
    """The gateway's prompt estimate for `body` (what it reserves before vLLM counts)."""
    return parse_completion_request("chat", json.dumps(body).encode()).prompt_estimate


def parsed(calls: list[tuple[str, str]]) -> list[tuple[str, Any]]:
    return [(name, json.loads(arguments)) for name, arguments in calls]


def test_required_tool_call_fits_the_schema_streamed_or_not(stack: Stack) -> None:
    gateway = stack.client(max_retries=0)
    request: dict[str, Any] = dict(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=120,
        temperature=0, parallel_tool_calls=False,
    )  # fmt: skip
    response = gateway.chat.completions.create(**request)
    calls = calls_of(response)
    check_calls(calls)
    assert len(calls) == 1
    assert response.choices[0].finish_reason == "tool_calls"
    assert response.usage is not None
    assert response.usage.prompt_tokens <= estimate(request)

    stream = gateway.chat.completions.create(**request, stream=True)
    streamed, finish = reassembled_calls(stream)
    assert parsed(streamed) == parsed(calls)  # greedy: the same call, delta by delta
    assert finish == "tool_calls"


def test_parallel_tool_calls_stream_one_index_each(stack: Stack) -> None:
    # Unlimited calls (OpenAI's default): the tiny model never stops adding calls, so the
    # stream ends at max_tokens; every call it completed by then fits its schema.
    stream = stack.client(max_retries=0).chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=100,
        temperature=0, stream=True,
    )  # fmt: skip
    calls, _ = reassembled_calls(stream)
    complete = []
    for name, arguments in calls:
        try:
            complete.append((name, json.dumps(json.loads(arguments))))
        except ValueError:
            assert (name, arguments) == calls[-1], "only the last call may be cut off"
    assert len(complete) >= 2
    check_calls(complete)


@pytest.mark.parametrize("stream", [False, True])
def test_named_tool_choice_calls_that_tool(stack: Stack, stream: bool) -> None:
    request: dict[str, Any] = dict(
        model=MODEL, messages=ASK, tools=TOOLS, max_tokens=60, temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
    )  # fmt: skip
    gateway = stack.client(max_retries=0)
    if stream:
        calls, _ = reassembled_calls(gateway.chat.completions.create(**request, stream=True))
    else:
        calls = calls_of(gateway.chat.completions.create(**request))
    assert [name for name, _ in calls] == ["get_time"]
    check_calls(calls)


def test_tool_results_go_back_and_the_model_answers(stack: Stack) -> None:
    gateway = stack.client(max_retries=0)
    first = gateway.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=120,
        temperature=0, parallel_tool_calls=False,
    )  # fmt: skip
    calls = first.choices[0].message.tool_calls or []
    assert calls
    assistant = first.choices[0].message.model_dump(exclude_none=True)
    results = [
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temp_c": 21})}
        for call in calls
    ]
    messages = [*ASK, assistant, *results]
    body: dict[str, Any] = dict(
        model=MODEL, messages=messages, tools=TOOLS, max_tokens=16, temperature=0
    )
    second = gateway.chat.completions.create(**body)
    assert second.choices[0].message.content  # the tiny model answers in words, no call
    assert not second.choices[0].message.tool_calls
    assert second.usage is not None and first.usage is not None
    # The history (tool definitions, the call, its results) is in the prompt vLLM counted,
    # and the gateway reserved at least that much.
    assert second.usage.prompt_tokens > first.usage.prompt_tokens
    assert second.usage.prompt_tokens <= estimate(body)


@pytest.mark.parametrize("stream", [False, True])
def test_response_format_json_schema_validates(stack: Stack, stream: bool) -> None:
    gateway = stack.client(max_retries=0)
    request: dict[str, Any] = dict(
        model=MODEL, messages=ASK, response_format=RESPONSE_FORMAT, max_tokens=60, temperature=0
    )
    if stream:
        chunks = gateway.chat.completions.create(**request, stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    else:
        response = gateway.chat.completions.create(**request)
        assert response.choices[0].finish_reason == "stop"
        # Not rendered into the prompt: the estimate without it still bounds vLLM's count.
        assert response.usage is not None
        assert response.usage.prompt_tokens <= estimate({**request, "response_format": None})
        text = response.choices[0].message.content or ""
    jsonschema.validate(json.loads(text), ANSWER)


def test_reasoning_comes_apart_from_the_answer(stack: Stack) -> None:
    gateway = stack.client(max_retries=0)
    request: dict[str, Any] = dict(
        model=MODEL, messages=ASK, response_format=RESPONSE_FORMAT, max_tokens=60,
        temperature=0, extra_body=THINK,
    )  # fmt: skip
    response = gateway.chat.completions.create(**request)
    message = response.choices[0].message
    # vLLM 0.32 names it `reasoning` (older releases: `reasoning_content`).
    reasoning = (message.model_extra or {}).get("reasoning")
    assert reasoning and "<think>" not in reasoning and "</think>" not in reasoning
    jsonschema.validate(json.loads(message.content or ""), ANSWER)  # the answer, JSON only
    assert response.usage is not None and response.usage.completion_tokens_details is not None
    assert response.usage.completion_tokens_details.reasoning_tokens

    thought, answer = "", ""
    for chunk in gateway.chat.completions.create(**request, stream=True):
        for choice in chunk.choices:
            extra = choice.delta.model_extra or {}
            thought += extra.get("reasoning") or ""
            answer += choice.delta.content or ""
    assert (thought, answer) == (reasoning, message.content)


def test_without_thinking_nothing_is_reasoning(stack: Stack) -> None:
    # The profile's default (enable_thinking false) keeps plain answers plain.
    response = stack.client(max_retries=0).chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=8, temperature=0
    )
    assert response.choices[0].message.content
    assert not (response.choices[0].message.model_extra or {}).get("reasoning")


def test_tool_and_reasoning_tokens_are_charged_as_vllm_counted(stack: Stack) -> None:
    key_id, secret = create_key(stack, "tools-metering", "--tpm", "100000")
    response = client(stack, secret).chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=120,
        temperature=0, parallel_tool_calls=False, extra_body=THINK,
    )  # fmt: skip
    check_calls(calls_of(response))
    usage = response.usage
    assert usage is not None
    # The gateway settles after relaying the last byte: wait for its books.
    eventually(
        lambda: (
            (charged(stack, key_id, "prompt"), charged(stack, key_id, "completion"))
            == (usage.prompt_tokens, usage.completion_tokens)
        )
    )


NOT_A_SCHEMA = {"type": "objekt"}
# (request fields, the param the 400 names, who refuses it). vLLM names what its request
# model refuses ("body.tools.0.function.name"); a schema its grammar compiler refuses comes
# with no param, so the gateway checks schemas first.
BAD_REQUESTS = [
    pytest.param({"tools": [{"type": "function", "function": {}}]}, "body.tools.0", "vllm"),
    pytest.param({"tools": "get_weather"}, "body.tools", "vllm"),
    pytest.param(
        {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        "tool_choice",
        "vllm",
    ),
    pytest.param(
        {"response_format": {"type": "json_schema", "json_schema": {"schema": ANSWER}}},
        "body.response_format",
        "vllm",
    ),
    pytest.param(
        {
            "tools": [{"type": "function", "function": {"name": "f", "parameters": NOT_A_SCHEMA}}],
            "tool_choice": "required",  # a grammar from the schema: vLLM refuses it too
        },
        "tools[0].function.parameters",
        "gateway",
    ),
    pytest.param(
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "a", "schema": NOT_A_SCHEMA},
            }
        },
        "response_format.json_schema.schema",
        "gateway",
    ),
]


@pytest.mark.parametrize(("bad", "param", "refuser"), BAD_REQUESTS)
def test_malformed_tools_or_schema_is_a_400_naming_it_and_costs_nothing(
    stack: Stack, bad: dict[str, Any], param: str, refuser: str
) -> None:
    key_id, secret = create_key(stack, f"tools-bad-{param}", "--tpm", "100000")
    body = {"model": MODEL, "messages": ASK, "max_tokens": 8, **bad}
    with pytest.raises(BadRequestError) as caught:
        client(stack, secret).chat.completions.create(**body)
    error = caught.value
    assert error.status_code == 400
    assert isinstance(error.body, dict) and str(error.body.get("param")).startswith(param)
    with stack.off_the_books():
        direct = httpx.post(f"{stack.engine_url}/v1/chat/completions", json=body, timeout=60)
    assert direct.status_code == 400  # vLLM refuses it too
    if refuser == "vllm":  # relayed as vLLM wrote it
        assert error.response.json() == direct.json()
    else:
        assert direct.json()["error"]["param"] is None
    assert charged(stack, key_id, "prompt") == charged(stack, key_id, "completion") == 0


def test_tool_definitions_count_in_the_gateways_estimate(stack: Stack) -> None:
    # A long tool definition: vLLM's prompt count stays under the gateway's reservation.
    big = json.loads(json.dumps(TOOLS))
    big[0]["function"]["description"] = "Weather, hour by hour, for one city. " * 40
    body: dict[str, Any] = dict(
        model=MODEL, messages=ASK, tools=big, tool_choice="required", max_tokens=120,
        temperature=0, parallel_tool_calls=False,
    )  # fmt: skip
    response = stack.client(max_retries=0).chat.completions.create(**body)
    assert response.usage is not None
    plain = dict(model=MODEL, messages=ASK, max_tokens=1)
    assert response.usage.prompt_tokens > 40 * 8  # the definitions are in the prompt
    assert response.usage.prompt_tokens <= estimate(body)
    assert estimate(body) > estimate(plain)
