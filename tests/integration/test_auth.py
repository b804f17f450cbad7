"""Only the gateway faces clients, and it wants the key."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from urllib.parse import urlparse

import openai
import psutil
import pytest

from tests.integration.conftest import MODEL, Stack


def status_and_body(url: str, headers: dict[str, str]) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status), json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer sk-wrong"}, {"Authorization": "Basic Zm9vOmJhcg=="}],
    ids=["missing", "invalid", "wrong-scheme"],
)
def test_requests_without_the_key_get_openai_401(stack: Stack, headers: dict[str, str]) -> None:
    status, body = status_and_body(f"{stack.gateway_url}/v1/models", headers)
    assert status == 401
    error = body["error"]
    assert isinstance(error, dict)
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_api_key"
    assert "sk-wrong" not in json.dumps(body)


def test_official_client_raises_authentication_error(stack: Stack) -> None:
    client = openai.OpenAI(base_url=f"{stack.gateway_url}/v1", api_key="sk-not-a-key")
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )


def test_engine_is_on_loopback_and_not_the_gateway_port(stack: Stack) -> None:
    engine, gateway = urlparse(stack.engine_url), urlparse(stack.gateway_url)
    assert engine.port != gateway.port
    listening = [
        str(conn.laddr[0])
        for conn in psutil.net_connections(kind="inet")
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr[1] == engine.port
    ]
    assert listening and set(listening) == {"127.0.0.1"}, listening


@pytest.mark.parametrize("path", ["/v1/chat/completions/", "/v1/completions/"])
def test_a_trailing_slash_never_sends_the_client_to_the_engine(stack: Stack, path: str) -> None:
    """vLLM itself answers these with a 307 to its own address; through the gateway they
    are served (and metered) at the path vLLM serves."""
    engine = urlparse(stack.engine_url)
    body = (
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        if "chat" in path
        else {"model": MODEL, "prompt": "hi", "max_tokens": 2}
    )
    request = urllib.request.Request(
        f"{stack.gateway_url}{path}",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {stack.api_key}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:  # follows no redirect: 200
        assert response.status == 200
        assert "location" not in {name.lower() for name in response.headers}
        answer = json.loads(response.read())
    assert answer["usage"]["completion_tokens"] >= 1
    assert str(engine.port) not in json.dumps(answer)
