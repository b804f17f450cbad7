"""One run of the batch benchmark: the interactive key alone, a batch alone, both together.

    row = await measure_run(stack, plan)   # {"alone": {...}, "batch_alone": {...}, "both": {...}}

Interactive TTFT is taken while the key's closed loop runs: alone for `plan.seconds`, beside
the batch for as long as the batch's lines run. Batch tokens/s is vLLM's generated-token
counter over the time the batch is in progress, less the interactive requests' own tokens
(each makes exactly INTERACTIVE_MAX_TOKENS; those still running at the end count whole, an
overestimate of at most `concurrency` requests' tokens).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass

from openai import AsyncOpenAI

from bench.batch.interactive import INTERACTIVE_MAX_TOKENS, LoopResult, interactive_loop
from bench.batch.job import BatchRun, run_batch
from bench.batch.stack import Stack
from bench.fairness.load import metrics
from bench.gateway_overhead.processes import BenchError
from loadtest.scraper import GENERATION_TOKENS, RUNNING, WAITING
from serving.models.tiny_model import MODEL_NAME as MODEL

IDLE_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Plan:
    seconds: float
    lines: int
    batch_max_tokens: int
    concurrency: int


def ttft_summary(result: LoopResult) -> dict[str, object]:
    ttft = sorted(result.ttft_s)
    return {
        "n": len(ttft),
        "median_ms": statistics.median(ttft) * 1000 if ttft else float("nan"),
        "worst_ms": ttft[-1] * 1000 if ttft else float("nan"),
        "errors": result.errors[:3],
        "error_count": len(result.errors),
    }


async def _wait_idle(base_url: str) -> None:
    deadline = time.monotonic() + IDLE_TIMEOUT_S
    while time.monotonic() < deadline:
        values = await metrics(base_url)
        if values.get(RUNNING, 0) == 0 and values.get(WAITING, 0) == 0:
            return
        await asyncio.sleep(0.5)
    raise BenchError(f"the engine did not go idle within {IDLE_TIMEOUT_S:.0f} s")


async def _alone(stack: Stack, plan: Plan) -> dict[str, object]:
    key = stack.keys["interactive"]
    async with interactive_loop(stack.gateway_url, key, MODEL, concurrency=plan.concurrency) as r:
        await asyncio.sleep(plan.seconds)
    return ttft_summary(r)


async def _batch(stack: Stack, plan: Plan, *, beside: bool) -> dict[str, object]:
    """A batch to its end, with the interactive loop running while it is in progress when
    `beside`; its generated tokens/s and (beside) the interactive key's TTFT."""
    client = AsyncOpenAI(base_url=stack.gateway_url + "/v1", api_key=stack.keys["batch"])
    engine = stack.engine.base_url
    key = stack.keys["interactive"]
    marks: dict[str, float] = {}
    loop = interactive_loop(stack.gateway_url, key, MODEL, concurrency=plan.concurrency)
    result = LoopResult()

    async def on_start() -> None:
        nonlocal result
        if beside:
            result = await loop.__aenter__()
        marks["tokens_before"] = (await metrics(engine)).get(GENERATION_TOKENS, 0.0)

    async def on_end() -> None:
        marks["tokens_after"] = (await metrics(engine)).get(GENERATION_TOKENS, 0.0)
        if beside:
            await loop.__aexit__(None, None, None)

    async with client:
        done: BatchRun = await run_batch(
            client, MODEL, lines=plan.lines, max_tokens=plan.batch_max_tokens,
            on_start=on_start, on_end=on_end,
        )  # fmt: skip
    generated = marks["tokens_after"] - marks["tokens_before"]
    interactive_tokens = len(result.ttft_s) * INTERACTIVE_MAX_TOKENS
    row: dict[str, object] = {
        "status": done.status,
        "lines_completed": done.completed,
        "lines_failed": done.failed,
        "seconds": done.seconds,
        "batch_tokens": generated - interactive_tokens,
        "tokens_per_s": (generated - interactive_tokens) / done.seconds if done.seconds else 0.0,
    }
    if beside:
        row["interactive"] = ttft_summary(result)
    return row


async def measure_run(stack: Stack, plan: Plan) -> dict[str, dict[str, object]]:
    await _wait_idle(stack.engine.base_url)
    alone = await _alone(stack, plan)
    await _wait_idle(stack.engine.base_url)
    batch_alone = await _batch(stack, plan, beside=False)
    await _wait_idle(stack.engine.base_url)
    both = await _batch(stack, plan, beside=True)
    return {"alone": alone, "batch_alone": batch_alone, "both": both}
