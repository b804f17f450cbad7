"""Limits under real concurrency (docs/architecture.md, reliability cases 1 and 2, one gateway)."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest

from serving.gateway.keys import SqliteKeyStore
from serving.gateway.keys.record import KeySpec
from serving.gateway.quota import Limits
from tests.gateway.conftest import GatewayFactory
from tests.gateway.fake_upstream import FakeUpstream
from tests.gateway.scrape import key_usage, scrape, settled, value
from tests.gateway.servers import GatewayServer

pytestmark = pytest.mark.timeout(60)

BODY = {"model": "gated", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}


async def burst(
    gateway: GatewayServer,
    secret: str,
    count: int,
    *,
    path: str,
    body: dict[str, object],
    while_held: asyncio.Event | None = None,
    refusals_expected: int = 0,
) -> list[tuple[int, dict[str, object]]]:
    """`count` concurrent requests; returns (status, JSON body) in completion order."""
    headers = {"Authorization": f"Bearer {secret}"}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:

        async def one() -> tuple[int, dict[str, object]]:
            async with session.post(gateway.url + path, json=body) as response:
                return response.status, json.loads(await response.read())

        tasks = [asyncio.ensure_future(one()) for _ in range(count)]
        if while_held is not None:
            deadline = time.monotonic() + 30
            while sum(task.done() for task in tasks) < refusals_expected:
                assert time.monotonic() < deadline, "refusals did not arrive"
                await asyncio.sleep(0.01)
            while_held.set()
        return await asyncio.gather(*tasks)


def test_200_concurrent_requests_on_a_key_limited_to_c_admit_exactly_c(
    make_gateway: GatewayFactory, keys: SqliteKeyStore, upstream: FakeUpstream, token: str
) -> None:
    limit, total = 7, 200
    gateway = make_gateway(keys_db=str(keys.path))
    record, secret = keys.create(KeySpec("busy", limits=Limits(max_concurrency=limit)))
    held = asyncio.Event()

    async def scenario() -> list[tuple[int, dict[str, object]]]:
        async def release_when_held() -> None:
            await held.wait()
            # Every refusal is in; the admitted requests reach the upstream and wait there.
            deadline = time.monotonic() + 5
            while len(upstream.received(token)) < limit and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.1)  # room for a request that should not be there
            try:
                assert len(upstream.received(token)) == limit
            finally:
                upstream.release(token)

        releaser = asyncio.ensure_future(release_when_held())
        results = await burst(
            gateway, secret, total, path=f"/v1/chat/completions?t={token}", body=BODY,
            while_held=held, refusals_expected=total - limit,
        )  # fmt: skip
        await releaser
        return results

    results = asyncio.run(scenario())
    statuses = [status for status, _ in results]
    assert statuses.count(200) == limit
    assert statuses.count(429) == total - limit
    for status, payload in results:
        if status == 429:
            error = payload["error"]
            assert isinstance(error, dict)
            assert (error["type"], error["code"]) == ("requests", "rate_limit_exceeded")
    assert settled(gateway)
    samples = scrape(gateway)
    rejected = value(
        samples, "gateway_quota_rejections_total", key=record.key_id, reason="concurrency"
    )
    assert rejected == total - limit
    assert key_usage(gateway, record.key_id)[:2] == (0, limit)


def test_burst_over_requests_per_minute_admits_exactly_the_limit(
    make_gateway: GatewayFactory, keys: SqliteKeyStore
) -> None:
    gateway = make_gateway(keys_db=str(keys.path))
    record, secret = keys.create(KeySpec("bursty", limits=Limits(rpm=10)))
    body = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    results = asyncio.run(burst(gateway, secret, 60, path="/v1/chat/completions", body=body))
    statuses = [status for status, _ in results]
    assert (statuses.count(200), statuses.count(429)) == (10, 50)
    assert settled(gateway)
    assert key_usage(gateway, record.key_id)[:2] == (0, 10)
