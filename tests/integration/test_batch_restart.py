"""A gateway SIGKILLed mid-batch and started again on the same batch database finishes the
batch with no line lost or charged twice (docs/batches.md, durability), on the session's
real engine.

The killed gateway's counters die with it, so the session's oracle leaves this test out
(`oracle_exempt`) and the test checks the same rule against what survives the kill, the
usage ledger in keys.db: the batch tokens charged cover vLLM's own count of the test's
tokens, and they are each completed answer's usage once plus the cut runs' reservations.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import openai
import pytest

from serving.gateway.batches.store import BatchStore
from tests.integration.conftest import REPO, Stack, eventually, serving_env
from tests.integration.oracle import read_ledger
from tests.integration.test_batch_api import _chat, _line, _lines, _submit, _wait
from tests.integration.test_fair_sharing import own_gateway
from tests.integration.test_gateway_quota import create_key

LINES = 30
CONCURRENCY = "6"
MAX_TOKENS = 8


def _flags(workdir: Path) -> tuple[str, ...]:
    """The test's gateways: the same batch database, a batch of their own."""
    return ("--batch-db", str(workdir / "batches.db"), "--batch-concurrency", CONCURRENCY)


def client_of(url: str, secret: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=secret, max_retries=0)


def _batch_tokens(stack: Stack, key_id: str, first_day: str) -> int:
    """The key's batch tokens in the usage ledger, as `serving usage report` reads it."""
    printed = subprocess.run(
        [sys.executable, "-m", "serving.cli", "usage", "report", "--from", first_day,
         "--key", key_id, "--format", "json", "--keys-db", str(stack.keys_db)],
        env=serving_env(), cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    report = json.loads(printed)
    batch: dict[str, int] = report["total"]["batch"]
    assert report["total"]["total_tokens"] == batch["total_tokens"]  # no interactive call
    return batch["total_tokens"]


@pytest.mark.oracle_exempt
def test_a_gateway_killed_mid_batch_finishes_it_once_each_charged_once(
    stack: Stack, tmp_path: Path
) -> None:
    first_day = (datetime.now(UTC) - timedelta(days=1)).date().isoformat()
    key_id, secret = create_key(stack, "batch-restart")
    ids = [f"line-{n}" for n in range(LINES)]
    lines = [
        _line(
            custom_id, {**_chat(f"Name a colour, then the number {n}."), "max_tokens": MAX_TOKENS}
        )
        for n, custom_id in enumerate(ids)
    ]
    vllm_before = read_ledger(stack.gateway_url, stack.engine_url).engine_tokens
    store = BatchStore(tmp_path / "batches.db")  # read beside the gateways

    with own_gateway(stack, tmp_path, *_flags(tmp_path), counted=False) as first:
        batch = _submit(client_of(first.url, secret), lines)

        def mid_batch() -> bool:
            return len(store.done_lines(batch.id)) >= 3 and len(store.running_attempts()) >= 2

        eventually(mid_batch, budget_s=60, poll_s=0.05)
        first.process.kill()
        first.process.wait(30)
    cut = store.running_attempts()  # the runs the kill cut, as the next gateway finds them
    done_before = store.done_lines(batch.id)
    assert cut and len(done_before) < LINES, (cut, done_before)

    with own_gateway(stack, tmp_path, *_flags(tmp_path), counted=False) as second:
        api = client_of(second.url, secret)
        done = _wait(api, batch.id, "completed", "failed", "expired", "cancelled")
        assert done.status == "completed", done
        assert done.request_counts is not None
        assert (done.request_counts.completed, done.request_counts.failed) == (LINES, 0)
        outputs = _lines(api, done.output_file_id)
        vllm_counted = read_ledger(second.url, stack.engine_url).engine_tokens - vllm_before

    assert sorted(line["custom_id"] for line in outputs) == sorted(ids)  # each exactly once
    assert store.cut_attempts(batch.id) == cut and store.running_attempts() == []
    usage = {line["custom_id"]: line["response"]["body"]["usage"] for line in outputs}
    for attempt in cut:  # each reservation bounds what its run can have cost
        rerun = usage[ids[attempt.line - 1]]
        assert attempt.completion_tokens == MAX_TOKENS
        assert attempt.prompt_tokens >= rerun["prompt_tokens"], (attempt, rerun)
    answers = sum(entry["total_tokens"] for entry in usage.values())
    reserved = sum(attempt.prompt_tokens + attempt.completion_tokens for attempt in cut)
    charged = _batch_tokens(stack, key_id, first_day)
    assert charged >= vllm_counted, (charged, vllm_counted)  # vLLM's counters: the oracle
    # Each answer once, each cut run its reservation; a run the kill caught after its charge
    # was written and before its result was recorded also paid its own usage (at most its
    # reservation again).
    assert answers + reserved <= charged <= answers + 2 * reserved, (answers, reserved, charged)
    store.close()
