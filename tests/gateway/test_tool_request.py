"""Tool and response schemas are checked once admitted (400 naming the field), shapes are
left to vLLM, and the prompt estimate of a tool conversation bounds what the tiny model's real
chat template renders (the "never over a limit" promise holds with tools)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.gateway.errors import InvalidRequestError
from serving.gateway.openai_request import check_admitted, parse_completion_request
from serving.gateway.tool_request import check_schemas, schema_problem

GOOD = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}}


def tool(parameters: object) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "f", "parameters": parameters}}


def response_format(schema: object) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}


@pytest.mark.parametrize(
    ("data", "param"),
    [
        ({"tools": [tool(GOOD), tool({"type": "objekt"})]}, "tools[1].function.parameters"),
        (
            {"tools": [tool({"properties": {"a": {"minimum": "1"}}})]},
            "tools[0].function.parameters",
        ),
        (
            {"response_format": response_format({"required": "city"})},
            "response_format.json_schema.schema",
        ),
    ],
)
def test_a_schema_that_is_no_json_schema_is_a_400_naming_it(
    data: dict[str, Any], param: str
) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        check_schemas(data)
    assert caught.value.param == param
    assert "not a valid JSON Schema" in str(caught.value)


@pytest.mark.parametrize(
    "data",
    [
        {"tools": [tool(GOOD)], "response_format": response_format(GOOD)},
        {"tools": [tool(True)]},  # boolean schema: vLLM's to judge
        {"tools": [{"type": "function", "function": {"name": "f"}}]},  # no parameters: fine
        # Shapes vLLM refuses with a 400 naming the field itself: relayed, not duplicated.
        {"tools": "f"},
        {"tools": [{"type": "function", "function": {}}], "response_format": {"type": "text"}},
        {"response_format": {"type": "json_schema", "json_schema": "x"}},
        {"response_format": {"type": "json_schema", "json_schema": {"schema": 3}}},
    ],
)
def test_valid_schemas_and_other_shapes_pass(data: dict[str, Any]) -> None:
    check_schemas(data)


def test_the_draft_a_schema_names_is_the_one_checked() -> None:
    # Draft 4's exclusiveMaximum is a boolean; in 2020-12 it is a number.
    draft4 = {
        "$schema": "http://json-schema.org/draft-04/schema#",
        "maximum": 5,
        "exclusiveMaximum": True,
    }
    assert schema_problem(json.dumps(draft4)) is None
    assert schema_problem(json.dumps({"maximum": 5, "exclusiveMaximum": True})) is not None


BAD = {"type": 1}
PROMPTS: dict[str, dict[str, Any]] = {
    "chat": {"messages": [{"role": "user", "content": "hi"}]},
    "completion": {"prompt": "hi"},
    "responses": {"input": "hi"},
}
PATTERN_TOO_LARGE = {"type": "string", "pattern": "a{4294967296}"}  # once a 500


@pytest.mark.parametrize(
    ("kind", "fields", "param"),
    [
        ("chat", {"tools": [tool(BAD)]}, "tools[0].function.parameters"),
        ("chat", {"response_format": response_format(PATTERN_TOO_LARGE)},
         "response_format.json_schema.schema"),
        ("chat", {"structured_outputs": {"json": BAD}}, "structured_outputs.json"),
        ("chat", {"structured_outputs": {"json": json.dumps(BAD)}}, "structured_outputs.json"),
        ("chat", {"structured_outputs": {"json": "{"}}, "structured_outputs.json"),
        ("completion", {"response_format": response_format(BAD)},
         "response_format.json_schema.schema"),
        ("completion", {"structured_outputs": {"json": BAD}}, "structured_outputs.json"),
        ("responses", {"tools": [{"type": "function", "name": "f", "parameters": BAD}]},
         "tools[0].parameters"),
        ("responses", {"text": {"format": {"type": "json_schema", "name": "x", "schema": BAD}}},
         "text.format.schema"),
    ],
)  # fmt: skip
def test_schemas_are_checked_after_admission_on_every_route(
    kind: str, fields: dict[str, Any], param: str
) -> None:
    """Parsing (before the reservation) leaves schemas alone; `check_admitted` (after it)
    refuses a bad one on whichever route sends it."""
    body = json.dumps({"model": "m", **PROMPTS[kind], **fields}).encode()
    parsed = parse_completion_request(kind, body)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError) as caught:
        check_admitted(parsed)
    assert caught.value.param == param


def test_a_schema_nested_past_any_encoder_is_a_400() -> None:
    deep: object = {"type": "string"}
    for _ in range(2000):
        deep = {"items": deep}
    with pytest.raises(InvalidRequestError) as caught:
        check_schemas({"response_format": response_format(deep)})
    assert caught.value.param == "response_format.json_schema.schema"


# --- the prompt estimate with tools, against the real template -----------------------------


texts = st.text(st.characters(codec="utf-8"), max_size=40)
schemas = st.fixed_dictionaries(
    {"type": st.just("object")},
    optional={"properties": st.dictionaries(texts, st.just({"type": "string"}), max_size=3)},
)
tools = st.lists(
    st.builds(
        lambda name, description, schema: {
            "type": "function",
            "function": {"name": name or "f", "description": description, "parameters": schema},
        },
        st.from_regex(r"[a-z_]{1,12}", fullmatch=True),
        texts,
        schemas,
    ),
    min_size=1,
    max_size=3,
)
calls = st.lists(
    st.builds(
        lambda i, name, arguments: {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
        },
        st.integers(0, 99),
        st.from_regex(r"[a-z_]{1,12}", fullmatch=True),
        st.dictionaries(texts, texts, max_size=3),
    ),
    min_size=1,
    max_size=3,
)


@settings(max_examples=60, deadline=None)
@given(tools=tools, calls=calls, results=st.lists(texts, min_size=1, max_size=3), ask=texts)
def test_estimate_bounds_the_rendered_tool_conversation(
    tokenizer: Any, tools: list[Any], calls: list[Any], results: list[str], ask: str
) -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": ask},
        {"role": "assistant", "content": None, "tool_calls": calls},
        *({"role": "tool", "tool_call_id": "call_0", "content": text} for text in results),
    ]
    body = {"model": "m", "messages": messages, "tools": tools, "tool_choice": "required"}
    estimate = parse_completion_request("chat", json.dumps(body).encode()).prompt_estimate
    # transformers' template input: arguments as objects (vLLM parses them the same way)
    rendered = [
        {**m, "tool_calls": [_parsed(c) for c in m["tool_calls"]]} if "tool_calls" in m else m
        for m in messages
    ]
    for thinking in (False, True):
        ids = tokenizer.apply_chat_template(
            rendered,
            tools=tools,
            add_generation_prompt=True,
            enable_thinking=thinking,
            return_dict=True,
        )["input_ids"]
        assert len(ids) > len(rendered)  # the conversation's tokens, not a dict's two keys
        assert len(ids) <= estimate


def _parsed(call: dict[str, Any]) -> dict[str, Any]:
    function = call["function"]
    return {**call, "function": {**function, "arguments": json.loads(function["arguments"])}}
