"""The official `openai` client against the gateway in front of the fake upstream."""

from __future__ import annotations

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.gateway.servers import TEST_KEY, GatewayServer

pytestmark = pytest.mark.timeout(30)

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]


def client(gateway: GatewayServer, key: str = TEST_KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=key, max_retries=0, timeout=10)


def test_chat_completion(gateway: GatewayServer) -> None:
    with client(gateway) as api:
        completion = api.chat.completions.create(model="fake", messages=MESSAGES)
    assert completion.choices[0].message.content == "hello there"
    assert completion.usage is not None and completion.usage.total_tokens == 5


def test_chat_completion_stream(gateway: GatewayServer) -> None:
    with client(gateway) as api:
        stream = api.chat.completions.create(model="fake", messages=MESSAGES, stream=True)
        pieces = [chunk.choices[0].delta.content or "" for chunk in stream]
    assert "".join(pieces) == "one two three four"


def test_wrong_key_raises_authentication_error(gateway: GatewayServer) -> None:
    with (
        client(gateway, key="sk-wrong") as api,
        pytest.raises(openai.AuthenticationError) as caught,
    ):
        api.models.list()
    assert caught.value.status_code == 401
    assert caught.value.code == "invalid_api_key"


def test_models_list(gateway: GatewayServer) -> None:
    with client(gateway) as api:
        assert [model.id for model in api.models.list()] == ["fake"]


def test_stream_cut_by_upstream_raises_api_error(gateway: GatewayServer) -> None:
    pieces: list[str] = []
    with client(gateway) as api:
        stream = api.chat.completions.create(model="fault-reset", messages=MESSAGES, stream=True)
        with pytest.raises(openai.APIError, match="cut off"):
            pieces.extend(chunk.choices[0].delta.content or "" for chunk in stream)
    assert "".join(pieces) == "one two"
