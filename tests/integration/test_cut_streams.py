"""Streams cut by a slow reader are charged at least what vLLM counted (issue 36, point 4):
every stream kind (chat, chat with n > 1, a completions batch, Responses) read slowly for a few
events and then dropped, against the engine's own counters (`oracle`), with the slack the
oracle allows each cut request."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from tests.integration.conftest import MODEL, Stack
from tests.integration.oracle import CUT_SLACK_TOKENS, read_ledger

STORY = "Tell me a long story about a lighthouse keeper and the sea."
MESSAGES = [{"role": "user", "content": STORY}]
# Long answers (vLLM's `ignore_eos`: no early end of sequence), so each stream is still
# running when it is cut.
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": ("/v1/chat/completions", {"messages": MESSAGES, "ignore_eos": True}),
    "chat-n3": (
        "/v1/chat/completions",
        {"messages": MESSAGES, "n": 3, "ignore_eos": True, "temperature": 1, "seed": 1},
    ),
    "completion-batch": (
        "/v1/completions",
        {"prompt": [STORY, "Once upon a time", "The sea"], "ignore_eos": True},
    ),
    "responses": ("/v1/responses", {"input": STORY, "ignore_eos": True}),
}


def cut_slowly(stack: Stack, path: str, body: dict[str, Any], events: int) -> int:
    """Read `events` events of a stream, a pause after each (vLLM runs ahead and merges its
    tokens into fewer events), then drop the connection; the events read."""
    read = 0
    with (
        httpx.Client(timeout=120) as client,
        client.stream(
            "POST",
            stack.gateway_url + path,
            json=body,
            headers={"Authorization": f"Bearer {stack.api_key}"},
        ) as response,  # fmt: skip
    ):
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data:"):
                read += 1
                time.sleep(0.3)
            if read >= events:
                break
    return read


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_stream_cut_by_a_slow_reader_is_charged_what_vllm_counted(
    stack: Stack, case: str
) -> None:
    path, fields = CASES[case]
    tokens = "max_output_tokens" if path == "/v1/responses" else "max_tokens"
    body = {"model": MODEL, "stream": True, tokens: 1500, "temperature": 0, **fields}
    before = read_ledger(stack.gateway_url, stack.engine_url)
    assert cut_slowly(stack, path, body, events=8) == 8
    after = read_ledger(stack.gateway_url, stack.engine_url)
    # Charged by a bound; or, when vLLM finished while the gateway drained what it had
    # sent (it reads on for up to a second after the client left), by its final usage.
    sequences = 3 if case in ("chat-n3", "completion-batch") else 1
    assert after.cut - before.cut in (0, sequences)
    counted = after.engine_tokens - before.engine_tokens
    charged = after.charged - before.charged
    assert counted > 0
    print(f"{case}: vLLM counted {counted}, charged {charged}")  # the slack's calibration
    assert after.shortfall(before) <= 0, (
        f"{case}: vLLM counted {counted}, charged {charged} (+{CUT_SLACK_TOKENS} slack)"
    )
