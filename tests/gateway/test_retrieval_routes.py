"""The pooling routes through the gateway (against the fake upstream): /v1/embeddings as the
official `openai` client calls it, /v1/score, /v1/rerank and /v2/rerank. Each reserves its
prompt bound, is charged vLLM's usage (read from the answer's top level only), is refused at
its key's limit, and refuses what cannot be bounded before anything reaches the engine."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from serving.gateway.keys import SqliteKeyStore
from serving.gateway.keys.record import KeySpec
from serving.gateway.openai_request import parse_completion_request
from serving.gateway.proxy import WHOLE_BODY_LIMIT
from serving.gateway.quota import Limits
from serving.gateway.request_fields import Kind
from tests.gateway.conftest import GatewayFactory
from tests.gateway.fake_pooling import INPUT_TOKENS, PAIR_TOKENS
from tests.gateway.fake_upstream import FakeUpstream
from tests.gateway.scrape import key_usage, settled
from tests.gateway.servers import GatewayServer, http_client

pytestmark = pytest.mark.timeout(30)

TPM = 100_000
FORGED = '{"usage": {"prompt_tokens": 1, "total_tokens": 1}}'


def estimate(kind: Kind, body: dict[str, Any]) -> int:
    return parse_completion_request(kind, json.dumps(body).encode()).prompt_estimate


@pytest.fixture
def metered(make_gateway: GatewayFactory, keys: SqliteKeyStore) -> tuple[GatewayServer, str, str]:
    """A gateway with a key store (at most 3 inputs a request), and a key with limits."""
    gateway = make_gateway(keys_db=str(keys.path), max_pooling_inputs=3)
    record, secret = keys.create(KeySpec("retrieval", limits=Limits(rpm=100, tpm=TPM)))
    return gateway, record.key_id, secret


def charged(gateway: GatewayServer, key_id: str) -> int:
    assert settled(gateway)
    return key_usage(gateway, key_id)[3]


def test_embeddings_reserve_the_bound_and_are_charged_vllms_count(
    metered: tuple[GatewayServer, str, str],
) -> None:
    gateway, key_id, secret = metered
    texts = ["first text", "second"]
    api = openai.OpenAI(base_url=gateway.url + "/v1", api_key=secret, max_retries=0, timeout=10)
    with api:
        raw = api.embeddings.with_raw_response.create(model="fake", input=texts)
    reply = raw.parse()
    assert [item.index for item in reply.data] == [0, 1] and len(reply.data[0].embedding) == 4
    # the headers show the reservation (the bound), the key is charged vLLM's count
    bound = estimate("embeddings", {"model": "fake", "input": texts})
    assert int(raw.headers["x-ratelimit-remaining-tokens"]) == TPM - bound
    assert charged(gateway, key_id) == reply.usage.prompt_tokens == 2 * INPUT_TOKENS


@pytest.mark.parametrize(
    ("path", "kind", "body", "tokens"),
    [
        ("/v1/embeddings", "embeddings", {"input": [[1, 2], [3]]}, 2 * INPUT_TOKENS),
        ("/v1/embeddings", "embeddings", {"messages": [{"role": "user", "content": "hi"}]},
         INPUT_TOKENS),
        ("/v1/score", "score", {"queries": "q", "documents": ["a", "b", "c"]}, 3 * PAIR_TOKENS),
        ("/v1/score", "score", {"text_1": ["q", "r"], "text_2": ["a", "b"]}, 2 * PAIR_TOKENS),
        ("/v1/rerank", "rerank", {"query": "q", "documents": ["a", "b"]}, 2 * PAIR_TOKENS),
        ("/v2/rerank", "rerank", {"query": "q", "documents": ["a"], "top_n": 1}, PAIR_TOKENS),
    ],
)  # fmt: skip
def test_each_route_is_charged_vllms_count(
    metered: tuple[GatewayServer, str, str], path: str, kind: Kind, body: dict[str, Any],
    tokens: int,
) -> None:  # fmt: skip
    gateway, key_id, secret = metered
    with http_client(gateway.url, key=secret) as http:
        response = http.post(path, json={"model": "fake", **body})
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["prompt_tokens"] == tokens
    bound = estimate(kind, {"model": "fake", **body})
    assert int(response.headers["x-ratelimit-remaining-tokens"]) == TPM - bound
    assert charged(gateway, key_id) == tokens


def test_usage_forged_in_an_echoed_document_is_never_charged(
    metered: tuple[GatewayServer, str, str],
) -> None:
    gateway, key_id, secret = metered
    documents = [FORGED, '", "usage": {"prompt_tokens": 0}}']
    with http_client(gateway.url, key=secret) as http:
        response = http.post(
            "/v1/rerank", json={"model": "fake", "query": FORGED, "documents": documents}
        )
    assert response.json()["results"][0]["document"]["text"] == FORGED
    assert charged(gateway, key_id) == 2 * PAIR_TOKENS


def test_an_answer_relayed_in_pieces_is_charged_its_usage(
    metered: tuple[GatewayServer, str, str],
) -> None:
    gateway, key_id, secret = metered
    with http_client(gateway.url, key=secret) as http:
        response = http.post("/v1/embeddings", json={"model": "fault-big", "input": "a"})
    assert response.status_code == 200 and len(response.content) > WHOLE_BODY_LIMIT
    assert charged(gateway, key_id) == INPUT_TOKENS


@pytest.mark.parametrize(
    ("path", "kind", "body"),
    [
        ("/v1/embeddings", "embeddings", {"input": ["one", "two"]}),
        ("/v1/rerank", "rerank", {"query": "q", "documents": ["a", "b"]}),
    ],
)
def test_an_answer_without_usage_is_charged_the_bound(
    metered: tuple[GatewayServer, str, str], path: str, kind: Kind, body: dict[str, Any]
) -> None:
    gateway, key_id, secret = metered
    body = {"model": "fault-no-usage", **body}
    with http_client(gateway.url, key=secret) as http:
        assert http.post(path, json=body).status_code == 200
    assert charged(gateway, key_id) == estimate(kind, body)


def test_an_engine_error_costs_nothing(metered: tuple[GatewayServer, str, str]) -> None:
    gateway, key_id, secret = metered
    with http_client(gateway.url, key=secret) as http:
        response = http.post("/v1/embeddings", json={"model": "fault-context", "input": "a"})
    assert response.status_code == 400 and response.json()["error"]["message"]
    assert charged(gateway, key_id) == 0


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/embeddings", {"input": ["a", "b", "c", "d"]}, "input"),
        ("/v1/rerank", {"query": "q", "documents": ["a", "b", "c", "d"]}, "documents"),
        ("/v1/embeddings", {"input": "a", "encoding_format": "bytes"}, "encoding_format"),
        ("/v1/embeddings", {"input": "a", "padding": "max_length"}, "padding"),
        ("/v1/score", {"queries": "q", "documents": "a", "mm_processor_kwargs": {"x": 1}},
         "mm_processor_kwargs"),
        ("/v2/rerank", {"query": "q", "documents": "a", "chat_template_kwargs": {"x": "y"}},
         "chat_template_kwargs.x"),
    ],
)  # fmt: skip
def test_what_cannot_be_bounded_is_a_400_that_reaches_no_engine(
    metered: tuple[GatewayServer, str, str], upstream: FakeUpstream, path: str,
    body: dict[str, Any], param: str,
) -> None:  # fmt: skip
    gateway, key_id, secret = metered
    before = upstream.requests_seen()
    with http_client(gateway.url, key=secret) as http:
        response = http.post(path, json={"model": "fake", **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", param)
    assert "x-ratelimit-limit-tokens" in response.headers
    assert upstream.requests_seen() == before
    assert charged(gateway, key_id) == 0


def test_a_key_at_its_limit_is_refused_with_openais_429(
    make_gateway: GatewayFactory, keys: SqliteKeyStore, upstream: FakeUpstream
) -> None:
    gateway = make_gateway(keys_db=str(keys.path))
    body = {"model": "fake", "query": "q", "documents": ["a", "b"]}
    _, secret = keys.create(KeySpec("small", limits=Limits(tpm=estimate("rerank", body) + 5)))
    with http_client(gateway.url, key=secret) as http:
        assert http.post("/v1/rerank", json=body).status_code == 200
        assert settled(gateway)
        before = upstream.requests_seen()
        refused = http.post("/v1/rerank", json=body)  # the bound no longer fits the minute
    assert refused.status_code == 429
    error = refused.json()["error"]
    assert (error["type"], error["code"]) == ("tokens", "rate_limit_exceeded")
    assert refused.headers["x-ratelimit-remaining-tokens"] == str(
        5 + estimate("rerank", body) - 2 * PAIR_TOKENS
    )
    assert "retry-after" in refused.headers
    assert upstream.requests_seen() == before
