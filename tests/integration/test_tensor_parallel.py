"""`serving engine --profile cpu-tiny-tp2`: TP=2 on CPU answers, and SIGTERM leaves no workers."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import psutil
from openai import OpenAI

from serving.engine.process import http_ok
from serving.engine.tiny_model import ensure_tiny_model
from tests.integration.conftest import MODEL, REPO, descendants, free_port, serving_env
from tests.integration.planner_truth import planned_capacity, vllm_cache_info


def test_tp2_engine_answers_and_stops_cleanly() -> None:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "serving.cli", "engine", "--profile", "cpu-tiny-tp2",
         "--port", str(port)],
        env=serving_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 600
        while not http_ok(f"http://127.0.0.1:{port}/health"):
            assert process.poll() is None, process.stdout.read() if process.stdout else ""
            assert time.monotonic() < deadline, "TP=2 engine did not start"
            time.sleep(1)
        names = sorted(child.name() for child in descendants(process.pid))
        # vLLM titles its processes: one worker per tensor-parallel rank.
        assert [n for n in names if n.startswith("VLLM::Worker_TP")] == [
            "VLLM::Worker_TP0",
            "VLLM::Worker_TP1",
        ], names
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")
        reply = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hello there."}],
            max_tokens=8, temperature=0, extra_body={"ignore_eos": True},
        )  # fmt: skip
        assert reply.usage is not None and reply.usage.completion_tokens == 8
        assert reply.choices[0].message.content
        # The planner's KV capacity for TP=2 equals what vLLM reports (per rank: half the heads).
        info = vllm_cache_info(f"http://127.0.0.1:{port}")
        planned = planned_capacity("cpu-tiny-tp2", str(ensure_tiny_model()))
        assert int(info["num_gpu_blocks"]) == planned.num_blocks
        assert int(info["kv_cache_size_tokens"]) == planned.tokens
    finally:
        children = descendants(process.pid)
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=90)
        _, alive = psutil.wait_procs(children, timeout=30)
    assert code == 0
    assert not alive, f"workers left behind: {alive}"
