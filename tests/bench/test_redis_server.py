"""The Redis store path's server and counters: a real redis-server started by the
benchmark's Launcher, and `delta` counting what a client sent (round trips) apart from what a
script ran inside Redis, and nothing of its own."""

from __future__ import annotations

import asyncio
from pathlib import Path

import redis

from bench.gateway_overhead.processes import Launcher
from bench.gateway_overhead.redis_server import ROUND_TRIPS, TOTAL, delta, start_redis


def test_counters_count_what_clients_sent_and_not_the_readings(tmp_path: Path) -> None:
    async def scenario() -> tuple[dict[str, int], dict[str, int], str, str]:
        with Launcher(tmp_path, pin=False) as launcher:
            server = await start_redis(launcher, cpu=0)
            client = redis.Redis(host=server.host, port=server.port)
            client.ping()  # connection set-up before the first reading
            before = await server.commands()
            for value in range(5):
                client.set("k", value)
            client.get("k")
            # One round trip running one command inside Redis (HINCRBY: the quota scripts'
            # own).
            client.eval("return redis.call('HINCRBY', KEYS[1], 'f', 1)", 1, "h")
            sent = delta(before, await server.commands())
            # Nothing between two readings: nothing counted.
            again = await server.commands()
            idle = delta(again, await server.commands())
            client.close()
            config = launcher.log_path("redis").read_text()
            return sent, idle, server.version, config

    sent, idle, version, log = asyncio.run(scenario())
    assert sent == {TOTAL: 8, ROUND_TRIPS: 7, "set": 5, "get": 1, "eval": 1, "hincrby": 1}
    assert idle == {TOTAL: 0, ROUND_TRIPS: 0}
    assert version[0].isdigit(), version
    assert "error" not in log.lower()


def test_delta_leaves_out_the_reading_itself() -> None:
    before = {TOTAL: 10, "evalsha": 4, "info": 3}
    after = {TOTAL: 15, "evalsha": 8, "info": 4, "ping": 0}
    assert delta(before, after) == {TOTAL: 4, ROUND_TRIPS: 4, "evalsha": 4}
