"""The gateway's view of a request is an upper bound of what vLLM does with it, checked
against the real engine on the tiny model: vLLM's own prompt counts never exceed the
reservation's prompt part, on every metered route, for bodies hypothesis generates; the
Responses API is metered for a limited key; fields vLLM renders into the prompt are counted.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from serving.gateway.openai_request import parse_completion_request
from serving.gateway.request_fields import Kind
from tests.integration.conftest import MODEL, Stack, eventually, scrape, total
from tests.integration.oracle import read_ledger
from tests.integration.test_gateway_quota import charged, client, create_key, idle

PATHS: dict[Kind, str] = {
    "chat": "/v1/chat/completions",
    "completion": "/v1/completions",
    "responses": "/v1/responses",
    "messages": "/v1/messages",
}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city, in degrees and words. " * 4,
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
            "required": ["city"],
        },
    },
}
# Ordinary English, for the tightness bound.
SENTENCES = [
    "Tell me about the weather in Paris today.",
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Our quarterly report shows revenue grew by twelve percent over last year.",
    "Please summarise the following meeting notes in three short bullet points.",
    "Why does the sky look blue during the day but red at sunset?",
]


def prompt_count(stack: Stack, kind: Kind, body: dict[str, Any]) -> int | None:
    """vLLM's own prompt tokens for `body` sent through the gateway (None: vLLM refused
    it with a 400, as it may for a body hypothesis made up)."""
    response = httpx.post(
        stack.gateway_url + PATHS[kind],
        json=body,
        headers={"Authorization": f"Bearer {stack.api_key}"},
        timeout=120,
    )
    assert response.status_code < 500, response.text
    if response.status_code != 200:
        assert response.json()["error"]["message"], response.text
        return None
    usage = response.json()["usage"]
    return int(usage["input_tokens"] if kind == "responses" else usage["prompt_tokens"])


def estimate(kind: Kind, body: dict[str, Any]) -> int:
    """The reservation's prompt part, by the gateway's own parser."""
    return parse_completion_request(kind, json.dumps(body).encode()).prompt_estimate


def on_the_engine(max_examples: int) -> settings:
    """Hypothesis settings for examples that each send real requests: few, reproducible, no
    deadline (the engine's pace is the machine's)."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


# -- bodies --------------------------------------------------------------------------------

text = st.text(
    st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=0, max_size=120
)
words = st.lists(st.sampled_from(SENTENCES), min_size=1, max_size=4).map(" ".join)
content = st.one_of(text, words)
tool: st.SearchStrategy[dict[str, Any]] = st.builds(
    lambda name, description: {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": {"x": {"type": "string"}}},
        },
    },
    st.from_regex(r"[a-z_]{1,20}", fullmatch=True),
    content,
)
messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user", "assistant"]), "content": content}
    ),
    min_size=1,
    max_size=4,
).map(lambda turns: [*turns, {"role": "user", "content": "Go on."}])


@st.composite
def chat_bodies(draw: st.DrawFn) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "messages": draw(messages), "max_tokens": 1}
    tools = draw(st.lists(tool, max_size=2))
    where = draw(st.sampled_from(["top", "kwargs", "none"]))
    if tools and where == "top":
        body["tools"] = tools
    elif tools and where == "kwargs":
        body["chat_template_kwargs"] = {"tools": tools}
    if draw(st.booleans()):
        kwargs = body.setdefault("chat_template_kwargs", {})
        kwargs["enable_thinking"] = draw(st.booleans())
    if draw(st.booleans()):
        kwargs = body.setdefault("chat_template_kwargs", {})
        kwargs["documents"] = [{"title": draw(text), "text": draw(content)}]
    return body


@st.composite
def completion_bodies(draw: st.DrawFn) -> dict[str, Any]:
    prompt = draw(
        st.one_of(content.filter(bool), st.lists(content.filter(bool), min_size=1, max_size=3))
    )
    return {"model": MODEL, "prompt": prompt, "max_tokens": 1}


@st.composite
def responses_bodies(draw: st.DrawFn) -> dict[str, Any]:
    given_input: object = draw(content.filter(bool))
    if draw(st.booleans()):
        given_input = [
            {"role": role, "content": [{"type": "input_text", "text": draw(content)}]}
            for role in draw(
                st.lists(st.sampled_from(["user", "assistant"]), min_size=1, max_size=3)
            )
        ] + [{"role": "user", "content": "Go on."}]
    body: dict[str, Any] = {"model": MODEL, "input": given_input, "max_output_tokens": 1}
    if draw(st.booleans()):
        body["instructions"] = draw(content)
    tools = draw(st.lists(tool, max_size=2))
    if tools:
        body["tools"] = [{"type": "function", **one["function"]} for one in tools]
    return body


BODIES = {"chat": chat_bodies(), "completion": completion_bodies(), "responses": responses_bodies()}


@pytest.mark.parametrize("kind", ["chat", "completion", "responses"])
def test_vllms_prompt_count_never_exceeds_the_reservation(stack: Stack, kind: Kind) -> None:
    counted: list[tuple[int, int]] = []

    @on_the_engine(max_examples=25)
    @given(BODIES[kind])
    def check(body: dict[str, Any]) -> None:
        reserved = estimate(kind, body)
        vllm = prompt_count(stack, kind, body)
        if vllm is not None:
            counted.append((vllm, reserved))
            assert vllm <= reserved, (body, vllm, reserved)

    check()
    assert len(counted) >= 20, counted  # vLLM took nearly every generated body


def test_ordinary_chat_is_reserved_within_three_times_vllms_count(stack: Stack) -> None:
    # The byte bound is loose by construction (a Qwen token holds 1 to ~16 bytes); on
    # ordinary chat it stays within 3x the engine's count plus the template's fixed part.
    for turns in range(1, 6):
        body = {
            "model": MODEL,
            "max_tokens": 1,
            "messages": [
                {
                    "role": "user" if i % 2 == 0 else "assistant",
                    "content": " ".join(SENTENCES[: i + 1]),
                }
                for i in range(turns)
            ],
        }
        vllm = prompt_count(stack, "chat", body)
        assert vllm is not None
        assert vllm <= estimate("chat", body) <= 3 * vllm + 128


def test_chat_template_kwargs_tools_count_against_the_minute(stack: Stack) -> None:
    # Once reserved at 111 tokens while vLLM counted 757: a --tpm 1000 key was served 1,514
    # tokens in its minute. The key here can afford one such request's reservation plus
    # (almost) one more request's real cost: reserved at the old 111, six requests would
    # have been served about five times vLLM's count, past the limit.
    body = {
        "model": MODEL,
        "max_tokens": 1,
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "chat_template_kwargs": {"tools": [WEATHER_TOOL] * 2},
    }
    with stack.off_the_books():
        direct = httpx.post(f"{stack.engine_url}/v1/chat/completions", json=body, timeout=120)
    cost = direct.json()["usage"]["total_tokens"]
    reserved = estimate("chat", body) + 1
    assert cost < reserved
    tpm = reserved + cost - 1
    key_id, secret = create_key(stack, "template-tools", "--tpm", str(tpm))
    served = 0
    with httpx.Client(base_url=stack.gateway_url, timeout=120) as http:
        for _ in range(6):
            response = http.post(
                "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {secret}"}
            )
            if response.status_code == 200:
                served += response.json()["usage"]["total_tokens"]
            else:
                assert response.status_code == 429, response.text
    assert 0 < served <= tpm
    eventually(lambda: idle(stack), budget_s=30)
    assert charged(stack, key_id, "prompt") + charged(stack, key_id, "completion") == served


def test_the_responses_api_is_metered_for_a_limited_key(stack: Stack) -> None:
    key_id, secret = create_key(stack, "responses", "--tpm", "100000", "--rpm", "100")
    openai_client = client(stack, secret)
    raw = openai_client.responses.with_raw_response.create(
        model=MODEL, input="Tell me about the weather.", max_output_tokens=8
    )
    first = raw.parse()
    remaining = int(raw.headers["x-ratelimit-remaining-tokens"])
    assert remaining < 100000
    assert first.usage is not None and first.usage.output_tokens <= 8
    usage_total = first.usage.input_tokens + first.usage.output_tokens

    streamed = openai_client.responses.with_raw_response.create(
        model=MODEL, input="Tell me a story.", max_output_tokens=8, stream=True,
        instructions="Be brief.",
    )  # fmt: skip
    assert int(streamed.headers["x-ratelimit-remaining-tokens"]) < remaining
    completed = None
    deltas = 0
    for event in streamed.parse():
        if event.type == "response.output_text.delta":
            deltas += 1
        if event.type in ("response.completed", "response.incomplete"):
            completed = event.response
    assert completed is not None and completed.usage is not None and deltas >= 1
    usage_total += completed.usage.input_tokens + completed.usage.output_tokens
    eventually(lambda: idle(stack), budget_s=30)
    assert charged(stack, key_id, "prompt") + charged(stack, key_id, "completion") == usage_total


# A usage-shaped object in every field vLLM echoes back in its Responses events (tools,
# text, metadata, instructions): the charge must still be vLLM's own count.
FORGED_USAGE = {"input_tokens": 0, "output_tokens": 0, "prompt_tokens": 0, "completion_tokens": 0}


def engine_tokens(stack: Stack) -> float:
    """vLLM's own prompt and generated tokens so far (the accounting oracle)."""
    samples = scrape(stack.engine_url)
    return total(samples, "vllm:prompt_tokens_total") + total(
        samples, "vllm:generation_tokens_total"
    )


@pytest.mark.parametrize("stream", [False, True])
def test_usage_the_client_writes_into_a_responses_request_is_not_its_charge(
    stack: Stack, stream: bool
) -> None:
    key_id, secret = create_key(stack, f"forger-{stream}", "--tokens-per-day", "100000")
    headers = {"Authorization": f"Bearer {secret}"}
    forged = json.dumps({"usage": FORGED_USAGE})
    tool = {
        "type": "function",
        "name": "lookup",
        "parameters": {"type": "object", "properties": {}, "usage": FORGED_USAGE},
    }
    body = {
        "model": MODEL, "input": "Tell me a story.", "max_output_tokens": 24, "stream": stream,
        "tools": [tool], "tool_choice": "none", "metadata": {"usage": forged},
        "instructions": forged, "text": {"format": {"type": "text"}, "usage": FORGED_USAGE},
    }  # fmt: skip
    eventually(lambda: idle(stack), budget_s=30)
    before = engine_tokens(stack)
    response = httpx.post(
        f"{stack.gateway_url}/v1/responses", json=body, headers=headers, timeout=120
    )
    if response.status_code == 400:  # vLLM may not take `text.usage`: without it then
        del body["text"]
        response = httpx.post(
            f"{stack.gateway_url}/v1/responses", json=body, headers=headers, timeout=120
        )
    assert response.status_code == 200, response.text
    eventually(lambda: idle(stack), budget_s=30)
    counted = engine_tokens(stack) - before
    charged_now = charged(stack, key_id, "prompt") + charged(stack, key_id, "completion")
    assert counted > 0
    assert charged_now == counted, (charged_now, counted)


def forged_event(value: Any) -> str:
    """`value` as the text of a whole SSE event carrying a final usage, as vLLM writes one."""
    data = {"type": "message_delta", "choices": [], "usage": value}
    return f"\n\nevent: message_delta\ndata: {json.dumps(data)}\n\n"


usage_shaped: st.SearchStrategy[Any] = st.one_of(
    st.fixed_dictionaries({name: st.integers(0, 3) for name in FORGED_USAGE}),
    st.fixed_dictionaries(
        {"usage": st.fixed_dictionaries({name: st.integers(0, 3) for name in FORGED_USAGE})}
    ),
).flatmap(
    lambda value: st.sampled_from(
        [value, json.dumps(value), json.dumps(value)[1:-1], forged_event(value)]
    )
)
# Where each route takes what a client writes, as (path, a way to put a value there).
PLACES: dict[Kind, list[str]] = {
    "chat": ["content", "name", "tool", "schema", "user"],
    "completion": ["prompt", "user"],
    "responses": ["input", "instructions", "metadata", "tool", "schema", "user"],
    "messages": ["content", "system", "metadata", "tool"],
}


def with_usage_in(kind: Kind, place: str, value: Any) -> dict[str, Any]:
    """A body of `kind` with `value` (a usage-shaped object or its text) at `place`."""
    as_text = value if isinstance(value, str) else json.dumps(value)
    schema = {"type": "object", "properties": {"usage": {"type": "string"}},
              "description": as_text}  # fmt: skip
    if kind == "completion":
        prompt = as_text if place == "prompt" else "Tell me a story."
        body: dict[str, Any] = {"prompt": prompt, "max_tokens": 8}
    elif kind == "chat":
        message = {"role": "user", "content": as_text if place == "content" else "Hi there."}
        if place == "name":
            message["name"] = as_text
        body = {"messages": [message], "max_tokens": 8}
        if place == "tool":
            function = {"name": "lookup", "description": as_text, "parameters": schema}
            body |= {"tools": [{"type": "function", "function": function}], "tool_choice": "none"}
        if place == "schema":
            spec = {"name": "answer", "schema": schema}
            body["response_format"] = {"type": "json_schema", "json_schema": spec}
    elif kind == "messages":
        message = {"role": "user", "content": as_text if place == "content" else "Hi there."}
        body = {"messages": [message], "max_tokens": 8}
        if place == "system":
            body["system"] = as_text
        if place == "metadata":
            body["metadata"] = {"user_id": as_text[:256]}
        if place == "tool":
            tool = {"name": "lookup", "description": as_text, "input_schema": schema}
            body |= {"tools": [tool], "tool_choice": {"type": "none"}}
    else:
        body = {"input": as_text if place == "input" else "Hi there.", "max_output_tokens": 8}
        if place == "instructions":
            body["instructions"] = as_text
        if place == "metadata":
            body["metadata"] = {"usage": as_text[:512]}
        if place == "tool":
            body |= {"tools": [{"type": "function", "name": "lookup", "parameters": schema}],
                     "tool_choice": "none"}  # fmt: skip
        if place == "schema":
            body["text"] = {"format": {"type": "json_schema", "name": "answer", "schema": schema}}
    if place == "user":
        body["user"] = as_text
    return {"model": MODEL, **body}


@pytest.mark.parametrize("kind", ["chat", "completion", "responses", "messages"])
def test_usage_shaped_values_in_any_client_field_never_lower_the_charge(
    stack: Stack, kind: Kind
) -> None:
    """What vLLM counted is charged, whatever usage-shaped objects or text the client puts in
    the fields vLLM may echo back (rule 3 of the accounting work)."""
    headers = {"Authorization": f"Bearer {stack.api_key}"}

    @on_the_engine(max_examples=8)
    @given(st.sampled_from(PLACES[kind]), usage_shaped, st.booleans())
    def check(place: str, value: Any, stream: bool) -> None:
        body = {**with_usage_in(kind, place, value), "stream": stream}
        before = read_ledger(stack.gateway_url, stack.engine_url, steady=False)
        response = httpx.post(stack.gateway_url + PATHS[kind], json=body, headers=headers,
                              timeout=120)  # fmt: skip
        assert response.status_code in (200, 400), response.text
        after = read_ledger(stack.gateway_url, stack.engine_url)
        counted = after.engine_tokens - before.engine_tokens
        assert after.cut == before.cut  # every answer ended with vLLM's usage
        assert after.charged - before.charged >= counted, (place, value, stream, body)

    check()


def test_health_answers_for_tools_that_probe_it(stack: Stack) -> None:
    # guidellm validates a target with GET /health before it benchmarks through it.
    response = httpx.get(f"{stack.gateway_url}/health", timeout=10)
    assert (response.status_code, response.content) == (200, b"")


def test_vllms_unmetered_routes_are_refused_for_the_dev_key_too(stack: Stack) -> None:
    headers = {"Authorization": f"Bearer {stack.api_key}"}
    body = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    with httpx.Client(base_url=stack.gateway_url, headers=headers, timeout=30) as http:
        for path in (
            "/v1/completions/render",
            "/v1/chat/completions/batch",
            "/v1/load_lora_adapter",
        ):
            response = http.post(path, json=body)
            assert response.status_code == 403, (path, response.text)
            assert response.json()["error"]["code"] == "endpoint_not_allowed"
        remote = {"type": "input_image", "image_url": "http://169.254.169.254/latest/x.png"}
        response = http.post(
            "/v1/responses",
            json={"model": MODEL, "input": [{"role": "user", "content": [remote]}]},
        )
        assert response.status_code == 400
        assert response.json()["error"]["param"].startswith("input[0].content[0]")
