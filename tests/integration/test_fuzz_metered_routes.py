"""Every route a key sends a body to (the metered ones, and Messages' count_tokens) fuzzed
from vLLM's own OpenAPI schema (schemathesis), through the gateway with a limited key: no body
gets a server error, every error is in its API's shape (both have `error.message`), and spend
never passes the key's limits. The pooling routes (embeddings, score, rerank) are fuzzed from
their own engines' schemas, on the pooling stack. A bounded number of examples per route keeps
it within the suite's time."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.core.result import Ok

from tests.integration.conftest import (
    EMBEDDING_MODEL,
    MODEL,
    RERANKER_MODEL,
    Stack,
    eventually,
    total,
)
from tests.integration.test_disconnect import running_requests
from tests.integration.test_gateway_quota import charged, create_key, gateway_metrics, idle

DAY_BUDGET = 40_000
EXAMPLES = 40
# Per API: each route, and the body of an ordinary request to it (fuzzed bodies are mostly
# refused, vLLM's schema allows far more than it accepts, so the key also spends on one
# ordinary body per metered route: the budget check then covers served requests).
HI = [{"role": "user", "content": "hi"}]
ROUTES: dict[str, dict[str, dict[str, Any] | None]] = {
    "openai": {
        "/v1/chat/completions": {"messages": HI},
        "/v1/completions": {"prompt": "hi"},
        "/v1/responses": {"input": "hi"},
    },
    "anthropic": {
        "/v1/messages": {"max_tokens": 8, "messages": HI},
        "/v1/messages/count_tokens": None,  # free
    },
}


@pytest.mark.parametrize("api", sorted(ROUTES))
def test_fuzzed_bodies_get_no_server_error_and_spend_stays_within_limits(
    stack: Stack, api: str
) -> None:
    routes = ROUTES[api]
    spec = httpx.get(f"{stack.engine_url}/openapi.json", timeout=30).json()
    schema = schemathesis.openapi.from_dict(spec).include(method="POST", path=list(routes))
    key_id, secret = create_key(
        stack, f"fuzz-{api}", "--tokens-per-day", str(DAY_BUDGET), "--max-tokens", "8",
        "--max-concurrency", "2",
    )  # fmt: skip
    # Anthropic's clients send the key as x-api-key
    headers = {"x-api-key": secret} if api == "anthropic" else {"Authorization": f"Bearer {secret}"}
    seen: dict[str, dict[int, int]] = {}
    results = list(schema.get_all_operations())
    operations = [result.ok() for result in results if isinstance(result, Ok)]
    assert len(operations) == len(results)
    assert sorted(op.path for op in operations) == sorted(routes)
    for operation in operations:
        fuzz(stack, operation, headers, seen.setdefault(operation.path, {}))
    for path, fields in routes.items():
        if fields is not None:
            served = httpx.post(
                stack.gateway_url + path, json={"model": MODEL, **fields}, headers=headers,
                timeout=120,
            )  # fmt: skip
            assert served.status_code == 200, served.text
    eventually(lambda: idle(stack), budget_s=60)
    spent = charged(stack, key_id, "prompt") + charged(stack, key_id, "completion")
    print(f"fuzzed {api}: {seen}, spent {spent}")
    assert 0 < spent <= DAY_BUDGET, (spent, seen)


# The pooling routes, each fuzzed from the schema of the engine that serves it (the embedding
# engine's, then the reranker's), with its model, and the body of an ordinary request.
POOLING: dict[str, tuple[int, str, dict[str, Any]]] = {
    "/v1/embeddings": (0, EMBEDDING_MODEL, {"input": ["hi", "there"]}),
    "/v1/score": (1, RERANKER_MODEL, {"queries": "hi", "documents": ["hi", "there"]}),
    "/v1/rerank": (1, RERANKER_MODEL, {"query": "hi", "documents": ["hi", "there"]}),
    "/v2/rerank": (1, RERANKER_MODEL, {"query": "hi", "documents": "there"}),
}
POOLING_EXAMPLES = 25


def test_fuzzed_pooling_bodies_get_no_server_error_and_spend_stays_within_limits(
    pooling_stack: Stack,
) -> None:
    stack = pooling_stack
    key_id, secret = create_key(stack, "fuzz-pooling", "--tokens-per-day", str(DAY_BUDGET))
    headers = {"Authorization": f"Bearer {secret}"}
    seen: dict[str, dict[int, int]] = {}
    for number, engine in enumerate(stack.engines):
        spec = httpx.get(f"{engine}/openapi.json", timeout=30).json()
        paths = [path for path, (owner, _, _) in POOLING.items() if owner == number]
        schema = schemathesis.openapi.from_dict(spec).include(method="POST", path=paths)
        results = list(schema.get_all_operations())
        operations = [result.ok() for result in results if isinstance(result, Ok)]
        assert sorted(op.path for op in operations) == sorted(paths)
        for operation in operations:
            model = POOLING[operation.path][1]
            statuses = seen.setdefault(operation.path, {})
            fuzz(stack, operation, headers, statuses, model=model, examples=POOLING_EXAMPLES,
                 always_model=True)  # fmt: skip
    for path, (_, model, fields) in POOLING.items():
        served = httpx.post(
            stack.gateway_url + path, json={"model": model, **fields}, headers=headers, timeout=120
        )
        assert served.status_code == 200, served.text
        assert served.json()["usage"]["prompt_tokens"] > 0
    eventually(lambda: idle(stack) and all_idle(stack), budget_s=60)
    spent = total(gateway_metrics(stack), "gateway_tokens_total", key=key_id)
    print(f"fuzzed pooling: {seen}, spent {spent}")
    assert 0 < spent <= DAY_BUDGET, (spent, seen)


def all_idle(stack: Stack) -> bool:
    """No engine of the stack is running a request (`idle` reads the first engine's)."""
    return all(running_requests(url) == 0 for url in stack.engines)


def fuzz(
    stack: Stack,
    operation: Any,
    headers: dict[str, str],
    statuses: dict[int, int],
    *,
    model: str = MODEL,
    examples: int = EXAMPLES,
    always_model: bool = False,
) -> None:
    """`always_model`: name the model in every body, where vLLM's schema makes it optional
    (the gateway requires it: without, most bodies would only test that 400)."""

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(operation.as_strategy())
    def check(case: Any) -> None:
        named = isinstance(case.body, dict) and case.body.get("model") is not None
        if isinstance(case.body, dict) and (named or always_model):
            case.body["model"] = model  # else most bodies only test model_not_found
        response = case.call(base_url=stack.gateway_url, headers=headers, timeout=120)
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        assert response.status_code < 500, (case.body, response.text[:500])
        if response.status_code >= 400:
            assert response.json()["error"]["message"], response.text[:500]

    check()
