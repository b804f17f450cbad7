"""The fake upstream's pooling routes, as vLLM 0.32 answers them for a pooling model.

    POST /v1/embeddings    one vector per input (a string, token ids, or a batch of either);
                           usage: `INPUT_TOKENS` per input, prompt = total
    POST /v1/score         one score per pair; usage: `PAIR_TOKENS` per pair
    POST /v1/rerank        vLLM's rerank answer, every document echoed in its result, usage
    POST /v2/rerank        (prompt and total, no completion_tokens) before the results
The model name picks a fault:
    fault-no-usage         the answer has no usage
    fault-big              the vectors are long enough that the answer passes the gateway's
                           whole-body limit (it is relayed in pieces)
    fault-context          400 in vLLM's error shape
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from tests.gateway.fake_bodies import VLLM_CONTEXT_400

if TYPE_CHECKING:
    from tests.gateway.fake_upstream import FakeUpstream

INPUT_TOKENS = 3
PAIR_TOKENS = 5
BIG_DIMENSIONS = 300_000  # "0.5, " each: past 1 MiB


def _usage(tokens: int) -> dict[str, int]:
    return {"prompt_tokens": tokens, "total_tokens": tokens}


def _inputs(given: Any) -> int:
    if isinstance(given, list) and given and not isinstance(given[0], int):
        return len(given)
    return 1


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


async def embeddings(upstream: FakeUpstream, request: web.Request) -> web.StreamResponse:
    body = await request.json()
    upstream.keep(request, body)
    model = body.get("model")
    if model == "fault-context":
        return web.json_response(VLLM_CONTEXT_400, status=400)
    count = _inputs(body.get("input", body.get("messages")))
    size = BIG_DIMENSIONS if model == "fault-big" else body.get("dimensions") or 4
    data = [{"index": i, "object": "embedding", "embedding": [0.5] * size} for i in range(count)]
    answer: dict[str, Any] = {"id": "embd-1", "object": "list", "model": model, "data": data}
    if model != "fault-no-usage":
        answer["usage"] = {**_usage(INPUT_TOKENS * count), "completion_tokens": 0}
    return web.json_response(answer)


async def score(upstream: FakeUpstream, request: web.Request) -> web.StreamResponse:
    body = await request.json()
    upstream.keep(request, body)
    pairs = len(_listed(body.get("documents", body.get("text_2", body.get("data_2")))))
    data = [{"index": i, "object": "score", "score": 0.5} for i in range(pairs)]
    answer = {"id": "score-1", "object": "list", "model": body.get("model"), "data": data}
    return web.json_response({**answer, "usage": _usage(PAIR_TOKENS * pairs)})


async def rerank(upstream: FakeUpstream, request: web.Request) -> web.StreamResponse:
    body = await request.json()
    upstream.keep(request, body)
    documents = _listed(body.get("documents"))
    results = [
        {"index": i, "document": {"text": text}, "relevance_score": 1.0 / (i + 1)}
        for i, text in enumerate(documents)
    ]
    answer: dict[str, Any] = {"id": "rerank-1", "model": body.get("model")}
    if body.get("model") != "fault-no-usage":
        answer["usage"] = _usage(PAIR_TOKENS * len(documents))
    return web.json_response({**answer, "results": results})
