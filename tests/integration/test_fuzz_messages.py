"""Anthropic's Messages routes fuzzed from vLLM's own OpenAPI schema (schemathesis), through
the gateway with a limited key, as `test_fuzz_metered_routes` does for the OpenAI ones: no
body gets a server error, every error is in Anthropic's shape, and spend never passes the
key's limits (the shared `fuzz` checks each error's `error.message`, which Anthropic's shape
has too)."""

from __future__ import annotations

from typing import Any

import httpx
import schemathesis
from schemathesis.core.result import Ok

from tests.integration.conftest import MODEL, Stack, eventually
from tests.integration.test_fuzz_metered_routes import fuzz
from tests.integration.test_gateway_quota import charged, create_key, idle

ROUTES = ["/v1/messages", "/v1/messages/count_tokens"]
DAY_BUDGET = 20_000


def test_fuzzed_messages_get_no_server_error_and_spend_stays_within_limits(stack: Stack) -> None:
    spec = httpx.get(f"{stack.engine_url}/openapi.json", timeout=30).json()
    schema = schemathesis.openapi.from_dict(spec).include(method="POST", path=ROUTES)
    key_id, secret = create_key(
        stack, "fuzz-messages", "--tokens-per-day", str(DAY_BUDGET), "--max-tokens", "8",
        "--max-concurrency", "2",
    )  # fmt: skip
    headers = {"x-api-key": secret}
    seen: dict[str, dict[int, int]] = {}
    results = list(schema.get_all_operations())
    operations = [result.ok() for result in results if isinstance(result, Ok)]
    assert sorted(op.path for op in operations) == ROUTES
    for operation in operations:
        fuzz(stack, operation, headers, seen.setdefault(operation.path, {}))
    # Mostly refusals: one ordinary message spends, so the budget check covers a served one.
    turns = [{"role": "user", "content": "hi"}]
    ask: dict[str, Any] = {"model": MODEL, "max_tokens": 8, "messages": turns}
    served = httpx.post(f"{stack.gateway_url}/v1/messages", json=ask, headers=headers, timeout=120)
    assert served.status_code == 200, served.text
    eventually(lambda: idle(stack), budget_s=60)
    spent = charged(stack, key_id, "prompt") + charged(stack, key_id, "completion")
    print(f"fuzzed messages: {seen}, spent {spent}")
    assert 0 < spent <= DAY_BUDGET, (spent, seen)
