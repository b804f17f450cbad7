"""The two tenants' load: a quiet key at a steady rate, a noisy key keeping streams going.

    quiet = await quiet_load([target], rate_per_s=2.0, seconds=20)  # TTFT of each request
    async with noisy_load([a, b], streams=48):                      # until the block ends
        ...

Both stream chat completions with `ignore_eos` (every request makes exactly its max_tokens)
and unique prompts (vLLM's prefix cache gives none of them a head start). Time to first token
is measured at the client: from sending the request to the first chunk carrying content.
Each load takes one tenant per gateway it goes through (gateway replicas): the quiet requests
take them in turn, the noisy streams are split evenly over them. `metrics` reads a server's
/metrics (the engine's counters, a gateway's gauges).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import aiohttp

from loadtest.scraper import parse_metrics

REQUEST_TIMEOUT_S = 300.0
QUIET_MAX_TOKENS = 16
NOISY_MAX_TOKENS = 256
_serial = itertools.count()


@dataclass(frozen=True)
class Tenant:
    base_url: str
    api_key: str
    model: str


@dataclass
class QuietResult:
    ttft_s: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _body(model: str, max_tokens: int) -> dict[str, object]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": f"Request {next(_serial)}: say something."}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
    }


async def _stream(session: aiohttp.ClientSession, tenant: Tenant, max_tokens: int) -> float:
    """One streamed request to its end; its time to first token in seconds."""
    started = time.perf_counter()
    first = 0.0
    async with session.post(
        tenant.base_url + "/v1/chat/completions",
        json=_body(tenant.model, max_tokens),
        headers={"Authorization": f"Bearer {tenant.api_key}"},
    ) as response:
        if response.status != 200:
            raise RuntimeError(f"status {response.status}: {(await response.text())[:200]}")
        async for line in response.content:
            if first or not line.startswith(b"data: {"):
                continue
            choices = json.loads(line[6:]).get("choices") or [{}]
            if (choices[0].get("delta") or {}).get("content"):
                first = time.perf_counter() - started
    if not first:
        raise RuntimeError("the stream carried no content")
    return first


def _session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0),
        timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S),
    )


async def metrics(base_url: str) -> dict[str, float]:
    """`base_url`'s /metrics: the series loadtest's scraper reads (vLLM's, the gateway's),
    combined over label sets."""
    async with aiohttp.ClientSession() as session, session.get(base_url + "/metrics") as r:
        return parse_metrics(await r.text())


async def quiet_load(
    tenants: Sequence[Tenant], *, rate_per_s: float, seconds: float
) -> QuietResult:
    """Requests at a steady `rate_per_s` for `seconds` (open loop: a slow answer does not
    delay the next request), each awaited to its end; request i goes to tenants[i % n]."""
    result = QuietResult()

    async def one(session: aiohttp.ClientSession, tenant: Tenant) -> None:
        try:
            result.ttft_s.append(await _stream(session, tenant, QUIET_MAX_TOKENS))
        except (aiohttp.ClientError, RuntimeError, TimeoutError) as exc:
            result.errors.append(f"{type(exc).__name__}: {exc}")

    async with _session() as session:
        tasks = []
        start = time.perf_counter()
        for index in range(max(1, round(rate_per_s * seconds))):
            await asyncio.sleep(max(0.0, start + index / rate_per_s - time.perf_counter()))
            tasks.append(asyncio.create_task(one(session, tenants[index % len(tenants)])))
        await asyncio.gather(*tasks)
    return result


@contextlib.asynccontextmanager
async def noisy_load(tenants: Sequence[Tenant], *, streams: int) -> AsyncIterator[list[str]]:
    """`streams` long streams kept going (each replaced as it ends, through the same tenant)
    until the block exits, when those still running are cut; stream i goes to
    tenants[i % n]. Yields the list its errors are appended to."""
    errors: list[str] = []

    async def keep_one(session: aiohttp.ClientSession, tenant: Tenant) -> None:
        while True:
            try:
                await _stream(session, tenant, NOISY_MAX_TOKENS)
            except (aiohttp.ClientError, RuntimeError, TimeoutError) as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(0.1)

    async with _session() as session:
        tasks = [
            asyncio.create_task(keep_one(session, tenants[index % len(tenants)]))
            for index in range(streams)
        ]
        try:
            yield errors
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
