"""The per-route field table, held against vLLM's own request models, and what it refuses."""

from __future__ import annotations

import json
from typing import Any

import pytest

from serving.gateway.errors import InvalidRequestError
from serving.gateway.openai_request import (
    BASE_TOKENS,
    MAX_CHOICES,
    PER_MESSAGE_TOKENS,
    TOOLS_TOKENS,
    parse_completion_request,
    render_upstream_body,
)
from serving.gateway.request_fields import COUNTED, FREE, REFUSED, Kind, classified

TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
RESPONSES_TOOL = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
BODIES: dict[Kind, dict[str, Any]] = {
    "chat": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    "completion": {"model": "m", "prompt": "hi"},
    "responses": {"model": "m", "input": "hi"},
    "messages": {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
    "embeddings": {"model": "m", "input": "hi"},
    "score": {"model": "m", "queries": "q", "documents": ["d"]},
    "rerank": {"model": "m", "query": "q", "documents": ["d"]},
}
KINDS: list[Kind] = list(BODIES)


def parse(kind: Kind, **fields: Any) -> Any:
    return parse_completion_request(kind, json.dumps({**BODIES[kind], **fields}).encode())


def param_of(kind: Kind, **fields: Any) -> str | None:
    with pytest.raises(InvalidRequestError) as caught:
        parse(kind, **fields)
    return caught.value.param


def vllm_fields(kind: Kind) -> set[str]:
    from vllm.entrypoints.anthropic.protocol import AnthropicMessagesRequest
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest
    from vllm.entrypoints.pooling.embed import protocol as embed
    from vllm.entrypoints.pooling.scoring import protocol as scoring

    # Each route's body is validated as one of several models (a union): all are read.
    models: dict[Kind, tuple[Any, ...]] = {
        "chat": (ChatCompletionRequest,),
        "completion": (CompletionRequest,),
        "responses": (ResponsesRequest,),
        "messages": (AnthropicMessagesRequest,),
        "embeddings": (
            embed.EmbeddingCompletionRequest, embed.EmbeddingChatRequest,
            embed.EmbeddingBatchChatRequest, embed.EmbeddingChatInputRequest,
            embed.EmbeddingBatchChatInputRequest,
        ),
        "score": (
            scoring.ScoreQueriesDocumentsRequest, scoring.ScoreQueriesItemsRequest,
            scoring.ScoreDataRequest, scoring.ScoreTextRequest,
        ),
        "rerank": (scoring.RerankRequest,),
    }  # fmt: skip
    return {name for model in models[kind] for name in model.model_fields}


def test_the_unions_vllm_validates_the_pooling_routes_with_are_all_read() -> None:
    # A variant added to vLLM's unions would bring fields the test above does not see.
    from typing import get_args

    from vllm.entrypoints.pooling.embed.protocol import EmbeddingRequest
    from vllm.entrypoints.pooling.scoring.protocol import ScoreRequest

    assert len(get_args(get_args(EmbeddingRequest)[0])) == 5
    assert len(get_args(ScoreRequest)) == 4


@pytest.mark.parametrize("kind", KINDS)
def test_every_field_vllm_reads_is_classified(kind: Kind) -> None:
    # A field a new vLLM adds fails here until request_fields decides about it.
    assert vllm_fields(kind) - classified(kind) == set()
    # What is classified beyond vLLM's fields: refusals shared by every route, best_of.
    extra = classified(kind) - vllm_fields(kind)
    assert extra <= {"best_of", "mm_processor_kwargs", "media_io_kwargs", "priority"}
    # Each field has one class: counted, free or refused.
    counted, free, refused = COUNTED[kind], FREE[kind], set(REFUSED[kind])
    assert not counted & free and not counted & refused and not free & refused


@pytest.mark.parametrize(
    ("kind", "field", "value"),
    [
        ("chat", "chat_template", "{{ messages }}"),
        ("chat", "mm_processor_kwargs", {"max_pixels": 10**9}),
        ("chat", "media_io_kwargs", {"image": {"x": 1}}),
        ("chat", "priority", -10),
        ("chat", "kv_transfer_params", {"do_remote_prefill": True}),
        ("chat", "stream_interval", 8),
        ("completion", "prompt_embeds", "AAAA"),
        ("completion", "priority", 1),
        ("responses", "previous_response_id", "resp_123"),
        ("responses", "prompt", {"id": "pmpt_1"}),
        ("responses", "background", True),
        ("responses", "mm_processor_kwargs", {"max_pixels": 10**9}),
        ("messages", "kv_transfer_params", {"do_remote_prefill": True}),
        ("messages", "mm_payload", "none"),
        ("embeddings", "padding", "max_length"),
        ("embeddings", "encoding_format", "bytes"),
        ("embeddings", "encoding_format", "bytes_only"),
        ("embeddings", "chat_template", "{{ messages }}"),
        ("embeddings", "priority", 5),
        ("score", "mm_processor_kwargs", {"max_pixels": 10**9}),
        ("rerank", "padding", "max_length"),
    ],
)
def test_fields_no_estimate_can_bound_are_400s_naming_them(
    kind: Kind, field: str, value: object
) -> None:
    assert param_of(kind, **{field: value}) == field
    assert field in REFUSED[kind]


@pytest.mark.parametrize(
    ("kind", "fields"),
    [
        ("chat", {"priority": 0, "stream_interval": 1, "chat_template": None}),
        ("chat", {"mm_processor_kwargs": {}, "mm_payload": "tensors"}),
        ("responses", {"background": False, "previous_response_id": None, "prompt": None}),
        ("chat", {"store": True, "metadata": {"a": "b"}, "prompt_cache_key": "x"}),  # vLLM ignores
        ("embeddings", {"encoding_format": "base64", "padding": "do_not_pad", "dimensions": 8}),
        ("rerank", {"top_n": 1, "truncate_prompt_tokens": 4, "max_tokens_per_doc": 2}),
    ],
)
def test_harmless_values_and_fields_vllm_ignores_pass(kind: Kind, fields: dict[str, Any]) -> None:
    parse(kind, **fields)


def test_a_default_is_matched_by_type_too() -> None:
    assert param_of("chat", priority=False) == "priority"


def test_chat_template_kwargs_are_counted_or_refused() -> None:
    plain = parse("chat").prompt_estimate
    tools = parse("chat", chat_template_kwargs={"tools": [TOOL]})
    assert tools.prompt_estimate >= plain + TOOLS_TOKENS + len(json.dumps([TOOL]))
    documents = [{"title": "t", "text": "x" * 500}]
    assert (
        parse("chat", chat_template_kwargs={"documents": documents}).prompt_estimate > plain + 500
    )
    assert parse("chat", chat_template_kwargs={"enable_thinking": False}).prompt_estimate == plain
    assert param_of("chat", chat_template_kwargs={"system": "x"}) == "chat_template_kwargs.system"
    assert param_of("chat", chat_template_kwargs={"enable_thinking": "no"}) == (
        "chat_template_kwargs.enable_thinking"
    )
    assert param_of("chat", chat_template_kwargs=[1]) == "chat_template_kwargs"
    assert param_of("responses", chat_template_kwargs={"x": 1}) == "chat_template_kwargs.x"


def test_rendered_extras_are_counted() -> None:
    plain = parse("chat").prompt_estimate
    schema = {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}}}
    assert parse("chat", response_format=schema).prompt_estimate >= plain + len(json.dumps(schema))
    assert parse("completion", suffix="x" * 100).prompt_estimate == 1 + 2 + 100


@pytest.mark.parametrize(
    ("kind", "fields", "param"),
    [
        ("chat", {"n": MAX_CHOICES + 1}, "n"),
        ("chat", {"n": 10**19}, "n"),
        ("completion", {"best_of": 10**19}, "best_of"),
        ("completion", {"prompt": ["a"] * 3, "n": 64}, "n"),
        ("completion", {"prompt": ["a"] * (MAX_CHOICES + 1)}, "prompt"),
    ],
)
def test_multipliers_are_bounded_before_any_store(
    kind: Kind, fields: dict[str, Any], param: str
) -> None:
    assert param_of(kind, **fields) == param


def test_n_at_the_bound_is_accepted() -> None:
    assert parse("chat", n=MAX_CHOICES).choices == MAX_CHOICES


# -- the Responses API ---------------------------------------------------------------------


def test_responses_estimate_counts_every_rendered_field() -> None:
    plain = parse("responses")
    assert plain.prompt_estimate == BASE_TOKENS + PER_MESSAGE_TOKENS + 2
    instructions = parse("responses", instructions="x" * 300)
    assert instructions.prompt_estimate == plain.prompt_estimate + PER_MESSAGE_TOKENS + 300
    tools = parse("responses", tools=[RESPONSES_TOOL])
    assert tools.prompt_estimate >= plain.prompt_estimate + TOOLS_TOKENS
    items = [
        {"role": "user", "content": [{"type": "input_text", "text": "y" * 200}]},
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": "z" * 100},
    ]
    listed = parse("responses", input=items)
    assert listed.prompt_estimate >= BASE_TOKENS + 3 * PER_MESSAGE_TOKENS + 300
    previous = parse("responses", previous_input_messages=[{"role": "user", "content": "w" * 50}])
    assert previous.prompt_estimate > plain.prompt_estimate + 50


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"type": "web_search_preview"}]}, "tools[0].type"),
        ({"tools": [{"type": "mcp", "server_url": "http://x"}]}, "tools[0].type"),
        ({"tools": [RESPONSES_TOOL, {"type": "code_interpreter"}]}, "tools[1].type"),
        ({"input": []}, "input"),
        ({"input": 5}, "input"),
        ({"input": ["text"]}, "input[0]"),
        (
            {
                "input": [
                    {"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}
                ]
            },
            "input[0].content[0].image_url",
        ),
        ({"max_output_tokens": 0}, "max_output_tokens"),
    ],
)
def test_responses_bodies_the_gateway_cannot_bound_are_400s(
    fields: dict[str, Any], param: str
) -> None:
    assert param_of("responses", **fields) == param


def test_responses_render_sets_max_output_tokens_and_keeps_the_stream_as_it_is() -> None:
    request = parse("responses", stream=True)
    assert request.max_tokens_field == "max_output_tokens"
    sent = json.loads(render_upstream_body(request, max_tokens=33))
    assert sent["max_output_tokens"] == 33
    assert "stream_options" not in sent and "max_tokens" not in sent
    asked = parse("responses", max_output_tokens=33)
    assert render_upstream_body(asked, max_tokens=33) == asked.body
