"""The prompt estimate of an Anthropic Messages body, and its field checks: an upper bound of
what vLLM renders, held against vLLM's own conversion of the body and the real template."""

from __future__ import annotations

import base64
import dataclasses
import io
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.gateway.anthropic_request import (
    PER_BLOCK_TOKENS,
    escaped_bytes,
    function_form_bytes,
    messages_prompt_estimate,
)
from serving.gateway.errors import InvalidRequestError
from serving.gateway.images import IMAGE_PART_TOKENS, ImagePolicy
from serving.gateway.openai_request import (
    BASE_TOKENS,
    PER_MESSAGE_TOKENS,
    TOOLS_TOKENS,
    check_admitted,
    check_count_tokens_body,
    parse_completion_request,
    render_upstream_body,
)

ASK = [{"role": "user", "content": "hi"}]
DEFAULTS = ImagePolicy.defaults()


def parse(**fields: Any) -> Any:
    body = {"model": "m", "max_tokens": 16, "messages": ASK, **fields}
    return parse_completion_request("messages", json.dumps(body).encode())


def param_of(**fields: Any) -> str | None:
    with pytest.raises(InvalidRequestError) as caught:
        parse(**fields)
    return caught.value.param


def png(width: int, height: int) -> str:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (width, height)).save(out, format="PNG")
    return base64.b64encode(out.getvalue()).decode()


def test_the_simplest_body_costs_the_template_and_its_text() -> None:
    request = parse()
    assert request.prompt_estimate == BASE_TOKENS + PER_MESSAGE_TOKENS + len("user") + len("hi")
    assert (request.requested_max_tokens, request.choices, request.kind) == (16, 1, "messages")


def test_every_rendered_field_adds_to_the_estimate() -> None:
    base = parse().prompt_estimate
    tool = {"name": "get_time", "description": "Now.", "input_schema": {"type": "object"}}
    assert parse(system="Be brief.").prompt_estimate == base + PER_MESSAGE_TOKENS + 9
    blocks = [{"type": "text", "text": "Bé brief."}]
    assert parse(system=blocks).prompt_estimate == (
        base + PER_MESSAGE_TOKENS + PER_BLOCK_TOKENS + len(json.dumps(blocks[0]).encode()) - 4
    )  # its JSON text in UTF-8: "é" is 2 bytes where json.dumps writes 6
    assert parse(tools=[tool]).prompt_estimate == (base + TOOLS_TOKENS + function_form_bytes(tool))
    assert function_form_bytes(tool) > len(json.dumps(tool))  # the wrapper vLLM adds
    choice = {"type": "tool", "name": "get_time"}
    assert parse(tools=[tool], tool_choice=choice).prompt_estimate == (
        parse(tools=[tool]).prompt_estimate + len(json.dumps(choice))
    )
    thinking = {"type": "enabled", "budget_tokens": 1024}
    assert parse(thinking=thinking).prompt_estimate > base
    schema = {"format": {"type": "json_schema", "schema": {"type": "object"}}}
    assert parse(output_config=schema).prompt_estimate > base
    kwargs = {"enable_thinking": False, "tools": [tool]}
    assert parse(chat_template_kwargs=kwargs).prompt_estimate >= base + TOOLS_TOKENS


def test_a_tool_added_in_the_system_turn_brings_the_tool_block() -> None:
    tool = {"name": "late", "input_schema": {}}
    added = {"type": "tool_addition", "tool": {"type": "tool_definition", "definition": tool}}
    estimate = parse(system=[added]).prompt_estimate
    assert estimate >= parse().prompt_estimate + TOOLS_TOKENS + function_form_bytes(tool)


def test_non_ascii_tool_input_is_counted_as_vllm_escapes_it() -> None:
    # vLLM writes a tool_use's input with json.dumps: each "é" becomes 6 bytes (\u00e9)
    text = "é" * 100
    call = {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"text": text}}
    turns = [*ASK, {"role": "assistant", "content": [call]}]
    assert escaped_bytes(call) == len(json.dumps(call)) > 600
    assert parse(messages=turns).prompt_estimate == parse().prompt_estimate + (
        PER_MESSAGE_TOKENS + len("assistant") + PER_BLOCK_TOKENS + escaped_bytes(call)
    )


def test_images_are_priced_by_size_and_refused_where_unbounded() -> None:
    small = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": png(28, 28)}}  # fmt: skip
    vision = dataclasses.replace(DEFAULTS, max_images=2)
    data = {"messages": [{"role": "user", "content": [small]}]}
    tokens = messages_prompt_estimate(data, vision)
    per_turn = PER_MESSAGE_TOKENS + len("user") + PER_BLOCK_TOKENS
    assert tokens == BASE_TOKENS + per_turn + vision.image_tokens(28, 28) + IMAGE_PART_TOKENS
    with pytest.raises(InvalidRequestError) as caught:
        messages_prompt_estimate({"messages": [{"role": "user", "content": [small] * 3}]}, vision)
    assert caught.value.param == "messages[0].content[2].source"
    remote = {"type": "image", "source": {"type": "url", "url": "http://169.254.169.254/x"}}
    result = {"type": "tool_result", "tool_use_id": "t", "content": [remote]}
    with pytest.raises(InvalidRequestError) as caught:
        messages_prompt_estimate({"messages": [{"role": "user", "content": [result]}]}, vision)
    assert caught.value.param == "messages[0].content[0].content[0].source"
    text_only = dataclasses.replace(DEFAULTS, max_images=0)
    with pytest.raises(InvalidRequestError) as caught:
        messages_prompt_estimate({"messages": [{"role": "user", "content": [small]}]}, text_only)
    assert caught.value.param == "messages[0].content[0].source"


def test_an_assistant_tool_result_is_text_images_included() -> None:
    image = {"type": "image", "source": {"type": "base64", "data": "A" * 5000}}
    result = {"type": "tool_result", "tool_use_id": "t", "content": [image]}
    turns = [*ASK, {"role": "assistant", "content": [result]}]
    # vLLM writes its content's str() into the prompt: the base64 is counted, not priced
    assert parse(messages=turns).prompt_estimate > 5000


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"max_tokens": None}, "max_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": "8"}, "max_tokens"),
        ({"messages": []}, "messages"),
        ({"messages": ["hi"]}, "messages[0]"),
        ({"tools": {"name": "f"}}, "tools"),
        ({"kv_transfer_params": {"do_remote_prefill": True}}, "kv_transfer_params"),
        ({"mm_payload": "none"}, "mm_payload"),
        ({"priority": -5}, "priority"),
        (
            {"chat_template_kwargs": {"chat_template": "{{x}}"}},
            "chat_template_kwargs.chat_template",
        ),
        (
            {"chat_template_kwargs": {"enable_thinking": "no"}},
            "chat_template_kwargs.enable_thinking",
        ),
    ],
)
def test_what_cannot_be_bounded_is_a_400_naming_the_field(
    fields: dict[str, Any], param: str
) -> None:
    assert param_of(**fields) == param


def test_harmless_and_free_fields_pass() -> None:
    parse(
        metadata={"user_id": "u" * 5000},  # read by no renderer
        stop_sequences=["\n\n"],
        temperature=0.5,
        top_k=5,
        top_p=0.9,
        stream=True,
        mm_payload="tensors",
        priority=0,
        cache_salt="salt",
        service_tier="auto",  # not vLLM's: ignored there
    )


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"name": "f", "input_schema": {"type": "objekt"}}]}, "tools[0].input_schema"),
        (
            {"output_config": {"format": {"type": "json_schema", "schema": {"type": 3}}}},
            "output_config.format.schema",
        ),
    ],
)
def test_schemas_are_checked_once_admitted(fields: dict[str, Any], param: str) -> None:
    request = parse(**fields)  # parsing alone never compiles a schema
    with pytest.raises(InvalidRequestError) as caught:
        check_admitted(request)
    assert caught.value.param == param


def test_count_tokens_bodies_are_checked_the_same_way() -> None:
    check_count_tokens_body(json.dumps({"model": "m", "messages": ASK}).encode(), DEFAULTS)
    bad = {"model": "m", "messages": ASK, "chat_template_kwargs": {"x": 1}}
    with pytest.raises(InvalidRequestError) as caught:
        check_count_tokens_body(json.dumps(bad).encode(), DEFAULTS)
    assert caught.value.param == "chat_template_kwargs.x"


def test_the_upstream_body_has_the_admitted_max_tokens_and_nothing_of_chats() -> None:
    request = parse(stream=True)
    assert not request.usage_upstream and not request.client_wants_usage
    data = json.loads(render_upstream_body(request, max_tokens=8, priority=3, stream_interval=4))
    assert data["max_tokens"] == 8
    assert not {"stream_options", "stream_interval", "priority", "max_completion_tokens"} & set(
        data
    )
    assert render_upstream_body(parse(), max_tokens=16) == parse().body  # unchanged


# --- the bound, against vLLM's conversion and the real template ---------------------------


texts = st.text(st.characters(codec="utf-8"), max_size=30)
# Long enough that the template's fixed overheads do not hide a bound that is too low.
long_texts = st.text(st.characters(codec="utf-8"), min_size=50, max_size=400)
names = st.from_regex(r"[a-z_]{1,10}", fullmatch=True)
values = st.recursive(
    st.none() | st.booleans() | st.integers(-1000, 1000) | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=6,
)
text_blocks = st.builds(lambda text: {"type": "text", "text": text}, long_texts)
tool_results = st.builds(
    lambda tid, content: {"type": "tool_result", "tool_use_id": tid, "content": content},
    names,
    long_texts | st.lists(text_blocks, min_size=1, max_size=2),
)
tool_uses = st.builds(
    lambda tid, name, given: {"type": "tool_use", "id": tid, "name": name, "input": given},
    names,
    names,
    st.dictionaries(texts, values | long_texts, max_size=3),
)
thinking = st.builds(lambda text: {"type": "thinking", "thinking": text, "signature": "sig"}, texts)
user_turns = st.builds(
    lambda content: {"role": "user", "content": content},
    texts.filter(bool) | st.lists(text_blocks | tool_results, min_size=1, max_size=3),
)
assistant_turns = st.builds(
    lambda content: {"role": "assistant", "content": content},
    st.lists(text_blocks | tool_uses | thinking | tool_results, min_size=1, max_size=3),
)
tools = st.lists(
    st.builds(
        lambda name, description, props: {
            "name": name,
            "description": description,
            "input_schema": {"properties": {key: {"type": "string"} for key in props}},
        },
        names,
        texts,
        st.lists(texts, max_size=2),
    ),
    max_size=2,
)
systems = st.none() | texts | st.lists(text_blocks, max_size=2)


@settings(max_examples=60, deadline=None)
@given(
    system=systems,
    turns=st.lists(st.tuples(user_turns, assistant_turns), min_size=1, max_size=2),
    last=user_turns,
    tools=tools,
)
def test_estimate_bounds_what_vllm_renders(
    tokenizer: Any,
    system: Any,
    turns: list[tuple[dict[str, Any], dict[str, Any]]],
    last: dict[str, Any],
    tools: list[dict[str, Any]],
) -> None:
    messages = [message for pair in turns for message in pair] + [last]
    body: dict[str, Any] = {"model": "m", "max_tokens": 8, "messages": messages}
    if system is not None:
        body["system"] = system
    if tools:
        body["tools"] = tools
    check_bound(tokenizer, body)


text_turns = st.builds(
    lambda role, content: {"role": role, "content": content},
    st.sampled_from(["user", "assistant"]),
    long_texts | st.lists(text_blocks, min_size=1, max_size=3),
)


@settings(max_examples=30, deadline=None)
@given(turns=st.lists(text_turns, min_size=1, max_size=3), last=user_turns)
def test_estimate_bounds_what_vllm_renders_of_text_turns(
    tokenizer: Any, turns: list[dict[str, Any]], last: dict[str, Any]
) -> None:
    # Text alone is where the bound is closest to the rendered count: a bound too low
    # shows here first (a thinking block or a tool's escaped input costs more than renders).
    check_bound(tokenizer, {"model": "m", "max_tokens": 8, "messages": [*turns, last]})


def check_bound(tokenizer: Any, body: dict[str, Any]) -> None:
    """The estimate of `body` is at least the tokens of the prompt vLLM makes of it: vLLM's
    own conversion to a chat request, rendered by the template with and without thinking."""
    from vllm.entrypoints.anthropic.protocol import AnthropicMessagesRequest
    from vllm.entrypoints.anthropic.serving import AnthropicServingMessages

    estimate = parse_completion_request("messages", json.dumps(body).encode()).prompt_estimate
    chat = AnthropicServingMessages.to_chat_completion_request(
        AnthropicMessagesRequest.model_validate(body), merge_inline_system=True
    )
    rendered = [_as_template_reads(message) for message in chat.messages]
    functions = [tool.model_dump() for tool in chat.tools] if chat.tools else None
    for enable_thinking in (False, True):
        ids = tokenizer.apply_chat_template(
            rendered,
            tools=functions,
            add_generation_prompt=True,
            enable_thinking=enable_thinking,
            return_dict=True,
        )["input_ids"]
        assert len(ids) <= estimate


def _as_template_reads(message: Any) -> dict[str, Any]:
    """A converted chat message as vLLM hands it to the template: text parts joined (Qwen's
    template takes a string), tool arguments parsed back into objects, reasoning where the
    template reads it."""
    out = dict(message)
    if isinstance(out.get("content"), list):
        out["content"] = "\n".join(part["text"] for part in out["content"])
    if "reasoning" in out:
        out["reasoning_content"] = out["reasoning"]
    if "tool_calls" in out:
        out["tool_calls"] = [
            {**call, "function": {**call["function"],
                                  "arguments": json.loads(call["function"]["arguments"])}}
            for call in out["tool_calls"]
        ]  # fmt: skip
    return out
