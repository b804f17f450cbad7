"""Closing a stream early aborts the request in vLLM (its KV cache is freed at once)."""

from __future__ import annotations

import re
import urllib.request

from tests.integration.conftest import MODEL, Stack, eventually, read_tokens

RUNNING = re.compile(r"^vllm:num_requests_running\{[^}]*\} ([0-9.]+)$", re.MULTILINE)


def running_requests(engine_url: str) -> float:
    with urllib.request.urlopen(f"{engine_url}/metrics", timeout=5) as response:
        text = response.read().decode()
    values = [float(value) for value in RUNNING.findall(text)]
    assert values, "vllm:num_requests_running missing from vLLM's /metrics"
    return sum(values)


def test_closing_a_stream_early_frees_the_engine(stack: Stack) -> None:
    assert running_requests(stack.engine_url) == 0
    stream = stack.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Tell me a long story."}],
        max_tokens=1800, stream=True, extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert read_tokens(stream) == 3
    # The request is really running in the engine while we hold the stream open.
    assert running_requests(stack.engine_url) >= 1
    stream.close()
    # Within 5 s of running time (host stalls excluded: see `eventually`); the request
    # would otherwise run for 1800 tokens.
    eventually(lambda: running_requests(stack.engine_url) == 0, budget_s=5)
