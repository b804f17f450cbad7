"""`serving up` with two pooling profiles and no chat engine: both engines healthy on their own
ports behind one gateway, whose catalog learned which model each serves, and vLLM's counters
count their prompt tokens exactly as their `usage` says (what the accounting oracle reads), and
keep the KV cache the planner plans for them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from serving.models.cached_build import Progress
from serving.models.tiny_embedding import ensure_tiny_embedding
from serving.models.tiny_reranker import ensure_tiny_reranker
from tests.integration.conftest import (
    EMBEDDING_MODEL,
    POOLING_PROFILES,
    RERANKER_MODEL,
    Stack,
    eventually,
    scrape,
    total,
)
from tests.integration.planner_truth import planned_capacity, vllm_cache_info

QUIET = Progress(quiet=True)


def test_the_gateway_lists_the_model_each_engine_serves(pooling_stack: Stack) -> None:
    embedding, reranker = pooling_stack.engines
    for url, model in ((embedding, EMBEDDING_MODEL), (reranker, RERANKER_MODEL)):
        listed = httpx.get(f"{url}/v1/models", timeout=30).json()["data"]
        assert [entry["id"] for entry in listed] == [model]
    headers = {"Authorization": f"Bearer {pooling_stack.api_key}"}
    response = httpx.get(f"{pooling_stack.gateway_url}/v1/models", headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    assert sorted(entry["id"] for entry in response.json()["data"]) == [
        EMBEDDING_MODEL,
        RERANKER_MODEL,
    ]


def computed(url: str) -> float:
    """The prompt tokens vLLM computed or took from its prefix cache (its counters)."""
    samples = scrape(url)
    return sum(
        total(samples, "vllm:prompt_tokens_by_source_total", source=source)
        for source in ("local_compute", "local_cache_hit")
    )


def settled_delta(url: str, before: float, expected: int) -> float:
    """The engine's count since `before`, once it reached `expected` (vLLM updates its
    counters a moment after the response)."""
    eventually(lambda: computed(url) - before >= expected)
    return computed(url) - before


def test_vllm_counts_pooling_prompt_tokens_as_their_usage_says(pooling_stack: Stack) -> None:
    """The oracle's side of the pooling engines: each request's `usage.prompt_tokens` is what
    vLLM's prompt-token counters move by. Text inputs get the tokenizer's <|endoftext|>
    appended (Qwen3-Embedding's), token-id inputs are counted as sent."""
    embedding, reranker = pooling_stack.engines
    with pooling_stack.off_the_books():
        before = computed(embedding)
        texts = {"input": ["The weather is nice today.", "Rain is coming."]}
        usage = post(embedding, "/v1/embeddings", texts)["usage"]["prompt_tokens"]
        assert settled_delta(embedding, before, usage) == usage
        before = computed(embedding)
        ids = [[261, 287, 81], [1533]]
        assert post(embedding, "/v1/embeddings", {"input": ids})["usage"]["prompt_tokens"] == 4
        assert settled_delta(embedding, before, 4) == 4

        before = computed(reranker)
        pair = {"query": "Is it raining?", "documents": ["Rain is coming.", "Bake bread."]}
        usage = post(reranker, "/v1/rerank", pair)["usage"]["prompt_tokens"]
        assert settled_delta(reranker, before, usage) == usage


def post(url: str, path: str, body: Mapping[str, object]) -> Any:
    model = EMBEDDING_MODEL if path.endswith("embeddings") else RERANKER_MODEL
    response = httpx.post(f"{url}{path}", json={"model": model, **body}, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def test_the_planned_kv_cache_is_the_one_vllm_keeps_for_a_pooling_model(
    pooling_stack: Stack,
) -> None:
    """vLLM keeps a KV cache for a causal pooling model, sized as the planner says."""
    builds = {
        "cpu-tiny-embedding": ensure_tiny_embedding,
        "cpu-tiny-reranker": ensure_tiny_reranker,
    }
    for url, profile in zip(pooling_stack.engines, POOLING_PROFILES, strict=True):
        info = vllm_cache_info(url)
        planned = planned_capacity(profile, str(builds[profile](progress=QUIET)))
        assert int(info["num_gpu_blocks"]) == planned.num_blocks, profile
        assert int(info["kv_cache_size_tokens"]) == planned.tokens == 16_384, profile
