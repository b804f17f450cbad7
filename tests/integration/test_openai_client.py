"""The official `openai` client against the gateway in front of real vLLM on the tiny model."""

from __future__ import annotations

import math
from typing import Any, cast

import pytest
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionStreamOptionsParam

from serving.profiles import load_profile
from tests.integration.conftest import MODEL, Stack

MESSAGES: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Tell me about the weather."}
]


def test_models_list_shows_the_served_model(stack: Stack) -> None:
    models = stack.client().models.list()
    assert [model.id for model in models] == [MODEL]


def test_chat_completion(stack: Stack) -> None:
    reply = stack.client().chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=16,
        temperature=0,
    )
    choice = reply.choices[0]
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str) and choice.message.content.strip()
    assert reply.usage is not None and 0 < reply.usage.completion_tokens <= 16
    assert reply.usage.prompt_tokens > 5


def test_max_tokens_is_respected(stack: Stack) -> None:
    reply = stack.client().chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=7, temperature=0,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert reply.usage is not None and reply.usage.completion_tokens == 7
    assert reply.choices[0].finish_reason == "length"


def test_stream_arrives_in_chunks_and_usage_matches_vllm(stack: Stack) -> None:
    ask: dict[str, Any] = dict(
        model=MODEL, messages=MESSAGES, max_tokens=24, temperature=0,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    stream = stack.client().chat.completions.create(
        **ask, stream=True, stream_options={"include_usage": True}
    )
    pieces: list[str] = []
    usage = None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            usage = chunk.usage
    assert len(pieces) >= 3, pieces  # 24 tokens, events of up to the profile's 8
    assert usage is not None and usage.completion_tokens == 24
    with stack.off_the_books():
        direct = stack.direct_client().chat.completions.create(**ask)
    assert direct.usage is not None
    assert direct.usage.prompt_tokens == usage.prompt_tokens
    assert direct.usage.completion_tokens == usage.completion_tokens
    assert direct.choices[0].message.content == "".join(pieces)


RUNNING_USAGE = {"include_usage": True, "continuous_usage_stats": True}


def test_stream_events_hold_up_to_the_profiles_stream_interval(stack: Stack) -> None:
    interval = load_profile("cpu-tiny").stream_interval  # serving up's default profile
    assert interval > 1
    stream = stack.client().chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=40,
        extra_body={"ignore_eos": True},
        stream=True,
        # vLLM's own option, which the SDK's type does not know
        stream_options=cast(ChatCompletionStreamOptionsParam, RUNNING_USAGE),
    )
    counts = [chunk.usage.completion_tokens for chunk in stream if chunk.choices and chunk.usage]
    content = [count for before, count in zip([0, *counts], counts, strict=False) if count > before]
    assert counts[-1] == 40
    # the gateway asked vLLM for events of `interval` tokens (the first comes alone); a reader
    # that lags behind only ever merges more: never more events than that, where an event
    # per token would be 40
    assert len(content) <= 1 + math.ceil((40 - 1) / interval), counts


def test_stream_without_usage_request_carries_no_usage(stack: Stack) -> None:
    stream = stack.client().chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=5,
        stream=True,
    )
    assert all(chunk.usage is None for chunk in stream)


def test_completion(stack: Stack) -> None:
    reply = stack.client().completions.create(
        model=MODEL, prompt="The weather today is", max_tokens=6, temperature=0,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert reply.choices[0].text
    assert reply.usage is not None and reply.usage.completion_tokens == 6


def test_unknown_model_is_an_openai_error(stack: Stack) -> None:
    import openai

    with pytest.raises(openai.NotFoundError) as excinfo:
        stack.client().chat.completions.create(
            model="no-such-model",
            messages=MESSAGES,
            max_tokens=4,
        )
    assert excinfo.value.status_code == 404
