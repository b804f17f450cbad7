"""A batch through the official `openai` client: upload its JSONL, create it, wait for it.

    batch = await run_batch(client, model, lines=2000, max_tokens=8, on_start=callback)

Lines are short chats with `ignore_eos` (exactly `max_tokens` each) and unique prompts.
`on_start` is awaited once the batch is `in_progress`, so a caller can start its clock (and its
interactive load) when the lines start running rather than while the file is validated.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from openai import AsyncOpenAI

POLL_S = 0.2
BATCH_TIMEOUT_S = 1800.0
_serial = itertools.count()


@dataclass(frozen=True)
class BatchRun:
    status: str
    completed: int
    failed: int
    seconds: float  # from in_progress seen to the end seen


def batch_file(model: str, *, lines: int, max_tokens: int) -> bytes:
    run = next(_serial)
    rows = (
        {
            "custom_id": f"line-{run}-{index}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": model,
                "messages": [{"role": "user", "content": f"Item {run}-{index}: classify it."}],
                "max_tokens": max_tokens,
                "ignore_eos": True,
            },
        }
        for index in range(lines)
    )
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


async def run_batch(
    client: AsyncOpenAI,
    model: str,
    *,
    lines: int,
    max_tokens: int,
    on_start: Callable[[], Awaitable[None]],
    on_end: Callable[[], Awaitable[None]],
) -> BatchRun:
    """Run one batch to its end; `on_start` when it is seen in progress, `on_end` when it is
    seen finished (both from the poll loop, so within POLL_S of the change)."""
    data = batch_file(model, lines=lines, max_tokens=max_tokens)
    uploaded = await client.files.create(file=("batch.jsonl", data), purpose="batch")
    batch = await client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    deadline = time.monotonic() + BATCH_TIMEOUT_S
    started = 0.0
    while time.monotonic() < deadline:
        batch = await client.batches.retrieve(batch.id)
        if not started and batch.status != "validating":
            started = time.perf_counter()
            await on_start()
        if batch.status in ("completed", "failed", "expired", "cancelled"):
            await on_end()
            counts = batch.request_counts
            return BatchRun(
                status=batch.status,
                completed=counts.completed if counts else 0,
                failed=counts.failed if counts else 0,
                seconds=time.perf_counter() - started,
            )
        await asyncio.sleep(POLL_S)
    raise TimeoutError(f"batch {batch.id} still {batch.status} after {BATCH_TIMEOUT_S:.0f} s")
