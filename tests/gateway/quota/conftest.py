"""The quota stores the store-level tests run over, and the Redis server they use.

`quota_store` builds a fresh store on a `ManualClock`, as an async context manager (a shared
store's client lives on the caller's event loop and is closed when the context ends, which
sends the endings it still queued): the in-memory store, and the Redis store on the
session's `redis-server`, emptied first.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest

from serving.gateway.quota import InMemoryQuotaStore, ManualClock, QuotaStore
from serving.gateway.quota.redis_store import RedisQuotaStore
from tests.gateway.quota.redis_server import RedisServer

StoreFactory = Callable[[ManualClock], AbstractAsyncContextManager[QuotaStore]]
# Functional tests bound a call generously (a busy machine); outage tests set their own.
SLOW_MACHINE_TIMEOUT_S = 10.0


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One redis-server for the session; tests that stop or kill one start their own."""
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@contextlib.asynccontextmanager
async def memory_store(clock: ManualClock) -> AsyncIterator[QuotaStore]:
    yield InMemoryQuotaStore(clock)


def redis_store(server: RedisServer) -> StoreFactory:
    @contextlib.asynccontextmanager
    async def make(clock: ManualClock) -> AsyncIterator[QuotaStore]:
        server.flush()
        store = RedisQuotaStore.from_url(server.url, clock=clock, timeout_s=SLOW_MACHINE_TIMEOUT_S)
        try:
            yield store
        finally:
            await store.close()

    return make


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def quota_store(request: pytest.FixtureRequest) -> StoreFactory:
    if request.param == "memory":
        return memory_store
    server: RedisServer = request.getfixturevalue("redis_server")
    return redis_store(server)


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test's own, free to be paused, killed and started again."""
    server = RedisServer(tmp_path / "redis")
    server.start()
    yield server
    server.stop()
