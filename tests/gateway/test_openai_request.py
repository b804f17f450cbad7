"""Parsing a metered request body: 400s with `param`, max_tokens rules, prompt estimates."""

from __future__ import annotations

import base64
import io
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image

from serving.gateway.errors import InvalidRequestError
from serving.gateway.images import IMAGE_PART_TOKENS, ImagePolicy
from serving.gateway.openai_request import (
    BASE_TOKENS,
    MAX_JSON_DEPTH,
    MAX_TOKENS_LIMIT,
    PER_MESSAGE_TOKENS,
    TOOLS_TOKENS,
    check_max_tokens,
    parse_completion_request,
    read_json_body,
    render_upstream_body,
)


def chat(**fields: Any) -> bytes:
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    body.update(fields)
    return json.dumps(body).encode()


def param_of(body: bytes, kind: str = "chat") -> str | None:
    with pytest.raises(InvalidRequestError) as caught:
        parse_completion_request(kind, body)  # type: ignore[arg-type]
    assert caught.value.http_status == 400
    return caught.value.param


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"{not json", None),
        (b"\xff\xfe", None),
        (b"[1, 2]", None),
        (b"[" * 100_000 + b"]" * 100_000, None),
        (chat(model=None), "model"),
        (chat(model=""), "model"),
        (chat(stream="yes"), "stream"),
        (chat(stream=True, stream_options=[]), "stream_options"),
        (
            chat(stream=True, stream_options={"include_usage": "yes"}),
            "stream_options.include_usage",
        ),
        (chat(max_tokens=-1), "max_tokens"),
        (chat(max_tokens=0), "max_tokens"),
        (chat(max_tokens=1.5), "max_tokens"),
        (chat(max_tokens="10"), "max_tokens"),
        (chat(max_tokens=True), "max_tokens"),
        (chat(max_completion_tokens=-3), "max_completion_tokens"),
        (chat(n=0), "n"),
        (chat(messages=[]), "messages"),
        (chat(messages="hi"), "messages"),
        (chat(messages=["hi"]), "messages"),
    ],
)
def test_bad_bodies_are_400_naming_the_field(body: bytes, param: str | None) -> None:
    assert param_of(body) == param


@pytest.mark.parametrize("prompt", [None, 3, [], [1, "a"], [{"x": 1}]])
def test_bad_prompts(prompt: object) -> None:
    assert param_of(json.dumps({"model": "m", "prompt": prompt}).encode(), "completion") == "prompt"


def test_max_tokens_variants() -> None:
    assert parse_completion_request("chat", chat()).requested_max_tokens is None
    assert parse_completion_request("chat", chat(max_tokens=None)).requested_max_tokens is None
    assert parse_completion_request("chat", chat(max_tokens=7)).requested_max_tokens == 7
    both = parse_completion_request("chat", chat(max_tokens=7, max_completion_tokens=9))
    assert both.requested_max_tokens == 9  # vLLM uses max_completion_tokens first
    huge = parse_completion_request("chat", chat(max_tokens=MAX_TOKENS_LIMIT))
    assert huge.requested_max_tokens == MAX_TOKENS_LIMIT  # capping is admission's job
    assert param_of(chat(max_tokens=MAX_TOKENS_LIMIT + 1)) == "max_tokens"
    assert param_of(chat(max_tokens=10**19)) == "max_tokens"


def test_chat_estimate_bounds_the_prompt_bytes() -> None:
    request = parse_completion_request("chat", chat())
    assert request.prompt_estimate == BASE_TOKENS + PER_MESSAGE_TOKENS + len("user") + len("hi")
    unicode = parse_completion_request(
        "chat", chat(messages=[{"role": "user", "content": "héllo"}])
    )
    assert unicode.prompt_estimate == request.prompt_estimate - 2 + len("héllo".encode())
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    with_tools = parse_completion_request("chat", chat(tools=tools))
    assert with_tools.prompt_estimate > request.prompt_estimate + TOOLS_TOKENS
    parts = [{"type": "text", "text": "x" * 50}]
    with_parts = parse_completion_request(
        "chat", chat(messages=[{"role": "user", "content": parts}])
    )
    assert with_parts.prompt_estimate > BASE_TOKENS + 50


def test_completion_prompts_and_choices() -> None:
    def parse(**fields: Any) -> Any:
        return parse_completion_request("completion", json.dumps({"model": "m", **fields}).encode())

    single = parse(prompt="abc")
    assert (single.prompt_estimate, single.choices) == (4, 1)
    batch = parse(prompt=["ab", "abcd"], n=3)
    assert (batch.prompt_estimate, batch.longest_prompt_estimate, batch.choices) == (8, 5, 6)
    ids = parse(prompt=[1, 2, 3], best_of=2)
    assert (ids.prompt_estimate, ids.choices) == (3, 2)
    assert parse(prompt=[[1, 2], [3]]).prompt_estimate == 3


def test_render_sets_max_tokens_and_forces_usage_in_streams() -> None:
    request = parse_completion_request("chat", chat(stream=True, max_completion_tokens=50))
    assert not request.client_wants_usage
    sent = json.loads(render_upstream_body(request, max_tokens=20))
    assert sent["max_tokens"] == sent["max_completion_tokens"] == 20
    assert sent["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert sent["messages"] == [{"role": "user", "content": "hi"}]

    asked = parse_completion_request(
        "chat", chat(stream=True, stream_options={"include_usage": True, "x": 1})
    )
    assert asked.client_wants_usage
    assert not asked.client_wants_running_usage
    kept = json.loads(render_upstream_body(asked, max_tokens=5))
    running = {"include_usage": True, "x": 1, "continuous_usage_stats": True}
    assert kept["stream_options"] == running

    options = {"include_usage": True, "continuous_usage_stats": True}
    unchanged = chat(max_tokens=3, stream=True, stream_options=options)
    assert parse_completion_request("chat", unchanged).client_wants_running_usage
    request = parse_completion_request("chat", unchanged)
    assert render_upstream_body(request, max_tokens=3) is unchanged  # nothing to rewrite

    plain = parse_completion_request("chat", chat(extra_field={"kept": True}))
    rendered = json.loads(render_upstream_body(plain, max_tokens=3))
    assert "stream_options" not in rendered and rendered["extra_field"] == {"kept": True}


def test_render_asks_for_the_gateways_stream_interval_in_chat_and_completion_streams() -> None:
    stream = parse_completion_request("chat", chat(stream=True))
    assert json.loads(render_upstream_body(stream, max_tokens=3, stream_interval=8)) == (
        json.loads(render_upstream_body(stream, max_tokens=3)) | {"stream_interval": 8}
    )
    completion = json.dumps({"model": "m", "prompt": "p", "stream": True}).encode()
    completions = parse_completion_request("completion", completion)
    rendered = render_upstream_body(completions, max_tokens=3, stream_interval=8)
    assert json.loads(rendered)["stream_interval"] == 8
    options = {"include_usage": True, "continuous_usage_stats": True}
    own = chat(max_tokens=3, stream=True, stream_options=options)
    request = parse_completion_request("chat", own)
    assert json.loads(render_upstream_body(request, max_tokens=3, stream_interval=4)) == (
        json.loads(own) | {"stream_interval": 4}
    )
    # Not in whole answers (one event anyway), nor in Responses streams (charged per event
    # when cut: vLLM has no running usage there), nor at 1 (vLLM's default)
    whole = parse_completion_request("chat", chat(max_tokens=3))
    assert render_upstream_body(whole, max_tokens=3, stream_interval=8) is whole.body
    responses_body = json.dumps({"model": "m", "input": "hi", "stream": True}).encode()
    responses = parse_completion_request("responses", responses_body)
    assert "stream_interval" not in json.loads(
        render_upstream_body(responses, max_tokens=3, stream_interval=8)
    )
    assert render_upstream_body(request, max_tokens=3, stream_interval=1) is own


@pytest.mark.parametrize(("value", "expected"), [(None, None), (1, 1), (10**9, 10**9)])
def test_check_max_tokens_accepts(value: object, expected: object) -> None:
    assert check_max_tokens(value) == expected  # huge is fine here: the quota engine caps it


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "max_tokens must be at least 1, got 0"),
        (-5, "max_tokens must be at least 1, got -5"),
        (1.5, "max_tokens must be an integer, got 1.5"),
        (2.0, "max_tokens must be an integer, got 2.0"),
        ("7", "max_tokens must be an integer, got '7'"),
        (True, "max_tokens must be an integer, got True"),
    ],
)
def test_check_max_tokens_rejects(value: object, message: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        check_max_tokens(value)
    assert (caught.value.message, caught.value.param) == (message, "max_tokens")


def test_check_max_tokens_names_the_param_it_was_given() -> None:
    with pytest.raises(InvalidRequestError) as caught:
        check_max_tokens(-1, "max_completion_tokens")
    assert caught.value.param == "max_completion_tokens"


def test_an_image_part_costs_its_tokens_by_the_policy_given() -> None:
    """The image's tokens by the rule's bounds, plus the template's around it; the rest
    of the message as before (tests/gateway/test_images.py holds the rule to transformers)."""
    buffer = io.BytesIO()
    Image.new("RGB", (1000, 1000)).save(buffer, "PNG")
    url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    part = {"type": "image_url", "image_url": {"url": url}}
    body = chat(messages=[{"role": "user", "content": [part]}])
    small = ImagePolicy(patch_size=14, merge_size=2, min_pixels=784, max_pixels=28 * 28 * 16,
                        max_images=1)  # fmt: skip
    base = BASE_TOKENS + PER_MESSAGE_TOKENS + len("user") + IMAGE_PART_TOKENS
    assert parse_completion_request("chat", body, images=small).prompt_estimate == base + 16
    default = parse_completion_request("chat", body).prompt_estimate
    assert default == base + 36 * 36  # 1000 px rounds to 1008 = 36 x 28 each way
    two = chat(messages=[{"role": "user", "content": [part, part]}])
    with pytest.raises(InvalidRequestError, match="at most 1") as caught:
        parse_completion_request("chat", two, images=small)
    assert caught.value.param == "messages[0].content[1]"


_JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()  # past 64 bits too: orjson reads those as floats, the body must not
    | st.integers(min_value=2**63 - 3, max_value=2**64 + 3)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4)
    ),
    max_leaves=12,
)


@given(value=_JSON_VALUES, ensure_ascii=st.booleans())
def test_bodies_read_as_the_standard_library_reads_them(value: Any, ensure_ascii: bool) -> None:
    # vLLM parses with the standard library; the gateway's faster path must see the same
    # values (an integer past 64 bits exactly, NaN and lone surrogates accepted).
    body = json.dumps({"v": value}, ensure_ascii=ensure_ascii).encode("utf-8", "surrogatepass")
    assert repr(read_json_body(body)) == repr(json.loads(body))


@given(body=st.binary(max_size=40))
def test_bytes_that_are_not_json_are_refused_as_the_standard_library_refuses_them(
    body: bytes,
) -> None:
    try:
        expected: Any = json.loads(body)
    except (ValueError, RecursionError):
        expected = ValueError
    try:
        got: Any = read_json_body(body)
    except ValueError:
        got = ValueError
    assert repr(got) == repr(expected)


def test_a_body_nested_past_the_limit_is_a_400_and_one_at_it_passes() -> None:
    def body(depth: int) -> bytes:  # the body object itself is the first level
        inner = "[" * (depth - 1) + "]" * (depth - 1)
        return (
            b'{"model":"m","messages":[{"role":"user","content":"hi"}],"x":' + inner.encode() + b"}"
        )

    parse_completion_request("chat", body(MAX_JSON_DEPTH))
    with pytest.raises(InvalidRequestError, match="nested more than"):
        parse_completion_request("chat", body(MAX_JSON_DEPTH + 1))
