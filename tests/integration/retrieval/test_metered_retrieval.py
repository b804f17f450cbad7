"""The pooling routes metered on the real engines (the pooling stack), with a limited key:
`/v1/embeddings` through the official `openai` client as docs/retrieval.md calls it, and
`/v1/score`, `/v1/rerank`, `/v2/rerank`. Each answers, shows its reservation in the
rate-limit headers, is charged exactly vLLM's usage, and is refused at the key's limit in
OpenAI's shape; the accounting oracle checks every test here against vLLM's counters."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from serving.gateway.openai_request import parse_completion_request
from serving.gateway.request_fields import Kind
from tests.integration.conftest import (
    EMBEDDING_MODEL,
    RERANKER_MODEL,
    Stack,
    eventually,
    scrape,
    total,
)
from tests.integration.test_fuzz_metered_routes import all_idle
from tests.integration.test_gateway_quota import create_key, gateway_metrics, idle

TPM = 50_000
TEXTS = ["Rain is coming.", "Bake bread at 220 degrees."]
QUERY = "Is it raining?"


def bound(kind: Kind, body: dict[str, Any]) -> int:
    return parse_completion_request(kind, json.dumps(body).encode()).prompt_estimate


def charged(stack: Stack, key_id: str) -> float:
    """The key's prompt and generated tokens, once nothing runs (the pooling models)."""
    eventually(lambda: idle(stack) and all_idle(stack), budget_s=60)
    return total(gateway_metrics(stack), "gateway_tokens_total", key=key_id)


def test_embeddings_through_the_openai_client_are_charged_vllms_count(
    pooling_stack: Stack,
) -> None:
    key_id, secret = create_key(pooling_stack, "embed", "--tpm", str(TPM))
    client = openai.OpenAI(
        base_url=f"{pooling_stack.gateway_url}/v1", api_key=secret, max_retries=0, timeout=120
    )
    raw = client.embeddings.with_raw_response.create(model=EMBEDDING_MODEL, input=TEXTS)
    reply = raw.parse()
    assert len(reply.data) == 2 and len(reply.data[0].embedding) > 0
    reserved = bound("embeddings", {"model": EMBEDDING_MODEL, "input": TEXTS})
    assert int(raw.headers["x-ratelimit-remaining-tokens"]) == TPM - reserved
    # vLLM's count: the tokens of each text and the <|endoftext|> its tokenizer appends
    assert 2 < reply.usage.prompt_tokens <= reserved
    assert charged(pooling_stack, key_id) == reply.usage.prompt_tokens


@pytest.mark.parametrize(
    ("path", "kind", "body"),
    [
        ("/v1/rerank", "rerank", {"query": QUERY, "documents": TEXTS}),
        ("/v2/rerank", "rerank", {"query": QUERY, "documents": TEXTS, "top_n": 1}),
        ("/v1/score", "score", {"queries": QUERY, "documents": TEXTS}),
    ],
)
def test_rerank_and_score_are_charged_vllms_count(
    pooling_stack: Stack, path: str, kind: Kind, body: dict[str, Any]
) -> None:
    key_id, secret = create_key(pooling_stack, "rank", "--tpm", str(TPM))
    response = httpx.post(
        f"{pooling_stack.gateway_url}{path}", json={"model": RERANKER_MODEL, **body},
        headers={"Authorization": f"Bearer {secret}"}, timeout=120,
    )  # fmt: skip
    assert response.status_code == 200, response.text
    answer = response.json()
    reserved = bound(kind, {"model": RERANKER_MODEL, **body})
    assert int(response.headers["x-ratelimit-remaining-tokens"]) == TPM - reserved
    usage = answer["usage"]["prompt_tokens"]
    assert 0 < usage <= reserved
    assert charged(pooling_stack, key_id) == usage


def test_a_key_at_its_limit_is_refused_in_openais_shape(pooling_stack: Stack) -> None:
    body = {"model": RERANKER_MODEL, "query": QUERY, "documents": TEXTS}
    reserved = bound("rerank", body)
    key_id, secret = create_key(pooling_stack, "tight", "--tpm", str(reserved))
    headers = {"Authorization": f"Bearer {secret}"}
    url = f"{pooling_stack.gateway_url}/v1/rerank"
    assert httpx.post(url, json=body, headers=headers, timeout=120).status_code == 200
    spent = charged(pooling_stack, key_id)
    refused = httpx.post(url, json=body, headers=headers, timeout=120)
    assert refused.status_code == 429, refused.text
    error = refused.json()["error"]
    assert (error["type"], error["code"]) == ("tokens", "rate_limit_exceeded")
    assert refused.headers["x-ratelimit-remaining-tokens"] == str(int(reserved - spent))
    assert int(refused.headers["retry-after"]) > 0
    assert charged(pooling_stack, key_id) == spent


def test_langchain_openai_embeddings_are_charged_vllms_count(pooling_stack: Stack) -> None:
    """LangChain's OpenAIEmbeddings pointed at the gateway as docs/retrieval.md shows
    (`check_embedding_ctx_length=False`: send text, not tiktoken's ids of OpenAI's
    vocabulary): documents and a query embedded as the openai client embeds them, the key
    charged what the embedding engine counted."""
    from langchain_openai import OpenAIEmbeddings
    from pydantic import SecretStr

    key_id, secret = create_key(pooling_stack, "langchain-embed", "--tpm", str(TPM))
    embedder = OpenAIEmbeddings(
        model=EMBEDDING_MODEL, base_url=f"{pooling_stack.gateway_url}/v1",
        api_key=SecretStr(secret), check_embedding_ctx_length=False, max_retries=0,
    )  # fmt: skip
    engine = pooling_stack.engine_urls[0]
    before = total(scrape(engine), "vllm:prompt_tokens_total")
    documents = embedder.embed_documents(TEXTS)
    query = embedder.embed_query(QUERY)
    assert len(documents) == 2 and len(query) == len(documents[0]) > 0
    eventually(lambda: idle(pooling_stack) and all_idle(pooling_stack), budget_s=60)
    counted = total(scrape(engine), "vllm:prompt_tokens_total") - before
    assert counted > 0
    assert charged(pooling_stack, key_id) == counted
    direct = openai.OpenAI(base_url=f"{pooling_stack.gateway_url}/v1", api_key=secret)
    same = direct.embeddings.create(model=EMBEDDING_MODEL, input=TEXTS[0]).data[0].embedding
    assert documents[0] == pytest.approx(same, abs=1e-6)
