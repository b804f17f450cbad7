"""Usage reports on the real engine (issue 28, item 5): streamed and unstreamed requests from
two keys through a gateway with a ledger in keys.db, then, per key, the report equals the
sum of the `usage` vLLM put in the responses and the gateway's `gateway_tokens_total`; in
all, it equals what vLLM's own `vllm:prompt_tokens_total` and `vllm:generation_tokens_total`
grew by over this traffic (no aborts). The session's engine is shared with the other tests,
which run one at a time: the counters are read with the engine idle before and after."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionStreamOptionsParam

from serving.gateway.keys import SqliteKeyStore
from serving.gateway.keys.record import KeySpec
from serving.gateway.settings import GatewaySettings
from serving.gateway.usage_ledger.days import DAY_S, utc_day
from serving.gateway.usage_reports import USAGE_PATH
from tests.gateway.scrape import scrape as every_series
from tests.gateway.servers import GatewayServer
from tests.integration.conftest import (
    MODEL,
    REPO,
    Samples,
    Stack,
    eventually,
    scrape,
    serving_env,
    total,
)
from tests.integration.oracle import front
from tests.integration.test_disconnect import running_requests

ADMIN_KEY = "adm-integration-usage"
VLLM_COUNTERS = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total")


@pytest.fixture
def keys_db(tmp_path: Path) -> Path:
    return tmp_path / "keys.db"


@pytest.fixture
def gateway(stack: Stack, keys_db: Path) -> Iterator[GatewayServer]:
    """A gateway of this test's own in front of the session's engine, with an admin key."""
    settings = GatewaySettings.create(
        upstream=stack.engine_url, api_keys=(), keys_db=str(keys_db), admin_keys=(ADMIN_KEY,)
    )
    server = GatewayServer(settings)
    server.start()
    with front(server.url, stack.engine_url):
        yield server
    server.stop()


def vllm_tokens(stack: Stack) -> tuple[float, float]:
    samples = scrape(stack.engine_url)
    prompt, generation = (total(samples, name) for name in VLLM_COUNTERS)
    return prompt, generation


def charged(samples: Samples, key_id: str) -> list[int]:
    return [
        int(total(samples, "gateway_tokens_total", key=key_id, kind=kind))
        for kind in ("prompt", "completion")
    ]


def traffic(gateway: GatewayServer, secret: str) -> list[int]:
    """Chat and completions, streamed and not; the usage the responses reported, summed."""
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=secret, max_retries=0)
    usage_on: ChatCompletionStreamOptionsParam = {"include_usage": True}
    messages: Any = [{"role": "user", "content": "Name three colours."}]
    reported: list[Any] = []
    reported.append(
        client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12).usage
    )
    stream = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=9, stream=True, stream_options=usage_on
    )
    reported.append([chunk.usage for chunk in stream if chunk.usage is not None][-1])
    reported.append(
        client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=7).usage
    )
    stream_text = client.completions.create(
        model=MODEL, prompt="The sky is", max_tokens=5, stream=True, stream_options=usage_on
    )
    reported.append([chunk.usage for chunk in stream_text if chunk.usage is not None][-1])
    assert all(usage is not None for usage in reported)
    return [
        sum(usage.prompt_tokens for usage in reported),
        sum(usage.completion_tokens for usage in reported),
    ]


def usage_report(gateway: GatewayServer, days: dict[str, str]) -> httpx.Response:
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    return httpx.get(f"{gateway.url}{USAGE_PATH}", params=days, headers=headers, timeout=30)


def around_now() -> dict[str, str]:
    """Yesterday to tomorrow (UTC): this test's rows, even if it runs across midnight."""
    now = time.time()
    return {"from": utc_day(now - DAY_S), "to": utc_day(now + DAY_S)}


def idle(stack: Stack, gateway: GatewayServer) -> bool:
    no_labels: frozenset[tuple[str, str]] = frozenset()
    in_flight = scrape(gateway.url).get(("gateway_in_flight_requests", no_labels), 0.0)
    return running_requests(stack.engine_url) == 0 and in_flight == 0


def test_the_report_equals_the_responses_the_gateway_and_vllm(
    stack: Stack, gateway: GatewayServer, keys_db: Path
) -> None:
    keys = SqliteKeyStore(keys_db)
    team_a, secret_a = keys.create(KeySpec("team-a"))
    team_b, secret_b = keys.create(KeySpec("team-b"))
    keys.close()
    eventually(lambda: idle(stack, gateway))
    before = vllm_tokens(stack)

    seen: dict[str, list[int]] = {}
    for key_id, secret in ((team_a.key_id, secret_a), (team_b.key_id, secret_b)) * 2:
        prompt, completion = traffic(gateway, secret)
        counts = seen.setdefault(key_id, [0, 0])
        counts[0] += prompt
        counts[1] += completion
    eventually(lambda: idle(stack, gateway))

    other_days = usage_report(gateway, {"from": "2000-01-01", "to": "2009-12-31"})
    assert other_days.status_code == 200 and other_days.json()["rows"] == []
    days = around_now()
    response = usage_report(gateway, days)
    assert response.status_code == 200, response.text
    report = response.json()
    per_key = {key["key_id"]: key for key in report["keys"]}
    assert set(per_key) == set(seen)
    samples = every_series(gateway)  # the per-key ones are not on the API port
    for key_id, usage in seen.items():
        row = per_key[key_id]
        assert [row["prompt_tokens"], row["completion_tokens"]] == usage == charged(samples, key_id)
        assert [model["model"] for model in row["models"]] == [MODEL]
        assert row["key_name"] in ("team-a", "team-b")

    # vLLM counts every prompt and generated token under the base model (adapters too); its
    # counters move with its engine steps, so they are read until they settle.
    in_all = [report["total"]["prompt_tokens"], report["total"]["completion_tokens"]]

    def vllm_grown() -> list[float]:
        after = vllm_tokens(stack)
        return [after[0] - before[0], after[1] - before[1]]

    with contextlib.suppress(AssertionError):
        eventually(lambda: vllm_grown() == in_all)
    assert vllm_grown() == in_all

    printed = subprocess.run(
        [sys.executable, "-m", "serving.cli", "usage", "report", "--from", days["from"],
         "--to", days["to"], "--format", "json", "--keys-db", str(keys_db)],
        env=serving_env(), cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert json.loads(printed) == report
