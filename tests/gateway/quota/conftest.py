"""The quota stores the store-level tests run over (`redis_server` and `own_redis`:
tests/gateway/conftest.py).

`quota_store` builds a fresh store on a `ManualClock`, as an async context manager (a shared
store's client lives on the caller's event loop and is closed when the context ends, which
sends the endings it still queued): the in-memory store, and the Redis store on the
session's `redis-server`, emptied first.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager

import pytest

from serving.gateway.quota import InMemoryQuotaStore, ManualClock, QuotaStore
from serving.gateway.quota.redis_store import RedisQuotaStore
from tests.gateway.quota.redis_server import RedisServer

StoreFactory = Callable[[ManualClock], AbstractAsyncContextManager[QuotaStore]]
# Functional tests bound a call generously (a busy machine); outage tests set their own.
SLOW_MACHINE_TIMEOUT_S = 10.0


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
