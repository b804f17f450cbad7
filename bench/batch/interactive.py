"""The interactive tenant's load: a closed loop of short streamed chats, TTFT per request.

    async with interactive_loop(url, key, model, concurrency=2) as result:
        ...                      # requests go on until the block ends
    result.ttft_s                # one time to first token per finished request

Each request asks for `ignore_eos` (exactly its max_tokens, so its tokens are known) and has a
unique prompt (no prefix cache head start). TTFT is measured at the client, from sending the
request to the first chunk carrying content.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp

INTERACTIVE_MAX_TOKENS = 8
REQUEST_TIMEOUT_S = 120.0
_serial = itertools.count()


@dataclass
class LoopResult:
    ttft_s: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


async def _one(session: aiohttp.ClientSession, url: str, key: str, model: str) -> float:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": f"Question {next(_serial)}: say hello."}],
        "max_tokens": INTERACTIVE_MAX_TOKENS,
        "ignore_eos": True,
        "stream": True,
    }
    started = time.perf_counter()
    first = 0.0
    headers = {"Authorization": f"Bearer {key}"}
    async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as r:
        if r.status != 200:
            raise RuntimeError(f"status {r.status}: {(await r.text())[:200]}")
        async for line in r.content:
            if first or not line.startswith(b"data: {"):
                continue
            choices = json.loads(line[6:]).get("choices") or [{}]
            if (choices[0].get("delta") or {}).get("content"):
                first = time.perf_counter() - started
    if not first:
        raise RuntimeError("the stream carried no content")
    return first


@contextlib.asynccontextmanager
async def interactive_loop(
    url: str, key: str, model: str, *, concurrency: int
) -> AsyncIterator[LoopResult]:
    """`concurrency` requests kept going, one after another each, until the block exits;
    the requests still running then are awaited to their end (their TTFT counts)."""
    result = LoopResult()
    stop = asyncio.Event()

    async def keep_one(session: aiohttp.ClientSession) -> None:
        while not stop.is_set():
            try:
                result.ttft_s.append(await _one(session, url, key, model))
            except (aiohttp.ClientError, RuntimeError, TimeoutError) as exc:
                result.errors.append(f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(0.1)

    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        tasks = [asyncio.create_task(keep_one(session)) for _ in range(concurrency)]
        try:
            yield result
        finally:
            stop.set()
            await asyncio.gather(*tasks)
