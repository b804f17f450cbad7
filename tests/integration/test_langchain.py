"""LangChain's ChatOpenAI through the gateway, with a limited key, as a LangChain user points
it at an OpenAI-compatible server: invoke, stream, structured output, and the Responses API
(`use_responses_api=True`), each charged to the key."""

from __future__ import annotations

import pytest
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field, SecretStr

from tests.integration.conftest import MODEL, Stack, eventually
from tests.integration.test_gateway_quota import charged, create_key, idle


class Weather(BaseModel):
    # Bounded, so that the grammar ends the tiny model's JSON well within max tokens.
    city: str = Field(max_length=12)
    sunny: bool


@pytest.fixture(scope="module")
def limited(stack: Stack) -> tuple[str, str]:
    return create_key(stack, "langchain", "--tpm", "200000", "--rpm", "100")


def chat_model(stack: Stack, secret: str, **options: object) -> ChatOpenAI:
    return ChatOpenAI(
        model=MODEL,
        base_url=f"{stack.gateway_url}/v1",
        api_key=SecretStr(secret),
        max_retries=0,
        temperature=0,
        **options,
    )


def spent(stack: Stack, key_id: str) -> float:
    eventually(lambda: idle(stack), budget_s=30)
    return charged(stack, key_id, "prompt") + charged(stack, key_id, "completion")


def test_invoke_and_stream(stack: Stack, limited: tuple[str, str]) -> None:
    key_id, secret = limited
    before = spent(stack, key_id)
    model = chat_model(stack, secret, max_completion_tokens=8)
    answer = model.invoke("Tell me about the weather.")
    assert answer.usage_metadata is not None
    total = answer.usage_metadata["total_tokens"]
    chunks = list(model.stream("Tell me a story.", stream_usage=True))
    assert len(chunks) >= 2
    usage = sum(chunks[1:], chunks[0]).usage_metadata
    assert usage is not None
    total += usage["total_tokens"]
    assert spent(stack, key_id) - before == total


def test_structured_output(stack: Stack, limited: tuple[str, str]) -> None:
    key_id, secret = limited
    before = spent(stack, key_id)
    # json_schema: vLLM's grammar holds the tiny model's output to the schema.
    structured = chat_model(stack, secret, max_completion_tokens=200).with_structured_output(
        Weather, method="json_schema", include_raw=True
    )
    result = structured.invoke("The weather in Paris: 21 degrees. Answer as JSON.")
    assert isinstance(result, dict)
    raw = result["raw"]
    assert raw.usage_metadata is not None
    assert isinstance(result["parsed"], Weather), result
    assert spent(stack, key_id) - before == raw.usage_metadata["total_tokens"]


def test_the_responses_api(stack: Stack, limited: tuple[str, str]) -> None:
    key_id, secret = limited
    before = spent(stack, key_id)
    model = chat_model(stack, secret, use_responses_api=True, max_tokens=8)
    answer = model.invoke("Tell me about the weather.")
    assert answer.usage_metadata is not None
    assert spent(stack, key_id) - before == answer.usage_metadata["total_tokens"]
