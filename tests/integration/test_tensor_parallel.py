"""`serving engine --profile cpu-tiny-tp2`: TP=2 on CPU answers, and SIGTERM leaves no workers."""

from __future__ import annotations

from openai import OpenAI

from serving.models.tiny_model import ensure_tiny_model
from tests.integration.conftest import MODEL, descendants, engine_process
from tests.integration.planner_truth import planned_capacity, vllm_cache_info
from tests.ports import free_port


def test_tp2_engine_answers_and_stops_cleanly() -> None:
    port = free_port()
    with engine_process("cpu-tiny-tp2", port) as process:
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
