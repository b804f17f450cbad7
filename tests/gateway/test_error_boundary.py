"""One error boundary: every failure on the request path is an OpenAI error JSON, and the
metrics record the status the client got."""

from __future__ import annotations

import json
from typing import Any

import pytest

from serving.gateway.keys import SqliteKeyStore
from serving.gateway.keys.record import KeySpec
from serving.gateway.metrics import NONE
from serving.gateway.quota import Limits
from tests.gateway.conftest import GatewayFactory, eventually
from tests.gateway.fake_upstream import FakeUpstream
from tests.gateway.scrape import idle, scrape, value
from tests.gateway.servers import TEST_KEY, http_client

MESSAGES = [{"role": "user", "content": "hi"}]


def requests_with_status(samples: Any, status: str, model: str = NONE) -> float:
    # NONE: refused while parsing, before the model is known.
    return value(samples, "gateway_requests_total", key="dev", model=model, status=status)


@pytest.mark.parametrize(
    "schema",
    [
        {"$schema": []},  # once a bare text/plain 500, counted as 499
        {"$ref": "#"},  # once vLLM's 500
        {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
        {"$ref": "#/$defs/missing"},
        {"$ref": "http://schemas.example/x.json"},
        {"type": "object", "properties": {"x": {"$ref": 5}}},
    ],
)
def test_schemas_no_grammar_can_be_built_from_are_400s_counted_as_such(
    make_gateway: GatewayFactory, upstream: FakeUpstream, schema: dict[str, Any]
) -> None:
    gateway = make_gateway()
    response_format = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    body = {"model": "fake", "messages": MESSAGES, "response_format": response_format}
    before = upstream.requests_seen()
    with http_client(gateway.url, key=TEST_KEY) as http:
        response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "response_format.json_schema.schema"
    assert upstream.requests_seen() == before
    samples = scrape(gateway)
    # Schemas are checked once admitted, so the model is known by then.
    assert requests_with_status(samples, "400", "fake") == 1
    assert requests_with_status(samples, "499", "fake") == 0


def test_a_recursive_schema_that_reaches_a_type_is_accepted(make_gateway: GatewayFactory) -> None:
    gateway = make_gateway()
    tree = {"type": "object", "properties": {"children": {"type": "array", "items": {"$ref": "#"}}}}
    response_format = {"type": "json_schema", "json_schema": {"name": "tree", "schema": tree}}
    body = {"model": "fake", "messages": MESSAGES, "response_format": response_format}
    with http_client(gateway.url, key=TEST_KEY) as http:
        assert http.post("/v1/chat/completions", json=body).status_code == 200


def test_a_bug_on_the_request_path_is_an_openai_500_counted_as_one(
    make_gateway: GatewayFactory,
) -> None:
    gateway = make_gateway()

    async def broken(*args: object) -> None:
        raise RuntimeError("a bug with a detail the client must not see")

    gateway.app.completions.handle = broken  # type: ignore[method-assign,assignment]
    with http_client(gateway.url, key=TEST_KEY) as http:
        response = http.post("/v1/chat/completions", json={"model": "fake", "messages": MESSAGES})
    assert response.status_code == 500
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("server_error", "internal_error")
    assert "detail" not in error["message"]
    assert "x-request-id" in response.headers
    samples = scrape(gateway)
    assert requests_with_status(samples, "500") == 1


def test_bodies_that_were_500s_are_400s_and_leave_the_key_its_slots(
    make_gateway: GatewayFactory, keys: SqliteKeyStore
) -> None:
    # Issue 36's probes: each answered 500 and kept the key's concurrency lease (and, for
    # the deep body, a fair-queue slot) until its TTL or for good.
    gateway = make_gateway(keys_db=str(keys.path), engine_slots=2, reserved_slots=0)
    _, secret = keys.create(KeySpec("probe", limits=Limits(max_concurrency=2)))
    pattern = {"type": "string", "pattern": "a{4294967296}"}
    response_format = {"type": "json_schema", "json_schema": {"name": "x", "schema": pattern}}
    schema_body = json.dumps({"model": "fake", "messages": MESSAGES, "stream": True,
                              "response_format": response_format})  # fmt: skip
    deep = "[" * 977 + "]" * 977
    deep_body = '{"model":"fake","stream":true,"messages":[{"role":"user","content":"hi"}],'
    deep_body += f'"metadata":{{"a":{deep}}}}}'
    headers = {"content-type": "application/json"}
    with http_client(gateway.url, key=secret) as http:
        for body in (schema_body, schema_body, deep_body, deep_body):
            response = http.post("/v1/chat/completions", content=body, headers=headers)
            assert response.status_code == 400, response.text
        assert eventually(lambda: idle(gateway))
        assert value(scrape(gateway), "gateway_queue_running") == 0
        plain = {"model": "fake", "messages": MESSAGES, "n": 2}  # both of the key's slots
        assert http.post("/v1/chat/completions", json=plain).status_code == 200
