"""`RedisKeyRefresh`: the first load before traffic, rounds in the background, and a Redis
that stops answering (paused: connections open, nothing comes back) costing a log line, not
the snapshot."""

from __future__ import annotations

import asyncio
import logging
import time
from urllib.parse import urlsplit

import pytest

from serving.gateway.keys.record import KeySpec
from serving.gateway.keys.redis_refresh import RedisKeyRefresh
from serving.gateway.keys.redis_store import KeyStoreUnavailable, RedisKeyStore
from tests.gateway.keys.conftest import StoreFactory
from tests.gateway.quota.redis_server import RedisServer, free_port

TIMEOUT_S = 0.3
# Only bounds how long a broken test hangs; never waited out.
DEADLINE_S = 30.0


def test_rounds_in_the_background_pick_up_a_new_key(
    redis_keys: StoreFactory, redis_server: RedisServer
) -> None:
    cli = redis_keys(redis_server.url)
    refresh = RedisKeyRefresh(redis_keys(redis_server.url).store, interval_s=0.05)

    async def scenario() -> bool:
        await refresh.load()
        refresh.start()
        try:
            _, secret = await cli.store.create(KeySpec("team-a"))
            deadline = time.monotonic() + DEADLINE_S
            while refresh.store.authenticate(secret) is None:
                if time.monotonic() > deadline:
                    return False
                await asyncio.sleep(0.01)
            return True
        finally:
            await refresh.stop()
            await cli.store.aclose()  # its connection is this loop's

    assert asyncio.run(scenario())


def test_a_black_holed_redis_keeps_the_snapshot_and_is_logged_once(
    redis_keys: StoreFactory, own_redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    record, secret = redis_keys(own_redis.url).create(KeySpec("team-a"))
    refresh = RedisKeyRefresh(redis_keys(own_redis.url, timeout_s=TIMEOUT_S).store)
    password = str(urlsplit(own_redis.url).password)

    async def scenario() -> None:
        await refresh.load()
        own_redis.pause()
        try:
            for _ in range(3):
                started = time.monotonic()
                await refresh.refresh()  # never raises
                assert time.monotonic() - started < TIMEOUT_S + 5.0
                assert refresh.store.authenticate(secret) == record
        finally:
            own_redis.resume()
        await refresh.refresh()
        await refresh.stop()

    with caplog.at_level(logging.INFO, logger="serving.gateway.keys"):
        asyncio.run(scenario())
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings
    assert warnings[0].startswith(
        f"keeping the last 1 API keys: Redis at 127.0.0.1:{own_redis.port}/0 is unavailable ("
    )
    assert warnings[1] == "API keys refreshed from Redis again"
    assert password not in caplog.text and secret not in caplog.text


def test_the_first_load_fails_with_a_message_naming_redis_and_not_the_password() -> None:
    port = free_port()  # nothing listens there
    refresh = RedisKeyRefresh(RedisKeyStore.from_url(f"redis://:hunter2@127.0.0.1:{port}/0"))
    with pytest.raises(KeyStoreUnavailable) as raised:
        asyncio.run(refresh.load())
    assert str(raised.value).startswith(
        f"cannot load the API keys: Redis at 127.0.0.1:{port}/0 is unavailable "
        "(RedisConnectError: cannot connect to Redis (ConnectionRefusedError))"
    )
    assert "hunter2" not in str(raised.value)
    asyncio.run(refresh.stop())
