"""Redis for the key store tests: the session's `redis-server` (tests/gateway/conftest.py),
shared by tests that each work under a namespace of their own; a server of its own, with a
password, for a test that stops it.

    store = redis_keys(redis_server.url)        # a fresh namespace, closed after the test
    store.create(...); store.store                # blocking calls; the async store inside
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from redis import Redis

from serving.gateway.keys.redis_store import DEFAULT_NAMESPACE, BlockingRedisKeyStore
from tests.gateway.quota.redis_server import RedisServer

StoreFactory = Callable[..., BlockingRedisKeyStore]


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test's own, free to be paused, killed and started again."""
    server = RedisServer(tmp_path / "redis", password="pw-" + uuid.uuid4().hex)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def redis_keys() -> Iterator[StoreFactory]:
    """`redis_keys(url, namespace=None, **options)`: a store over its own client, its calls
    blocking; stores made in one test share a fresh namespace unless told otherwise. Its
    `store` (the `RedisKeyStore`) may serve a loop of the test's own instead, which then
    closes it (`aclose`, or `RedisKeyRefresh.stop`)."""
    namespace = f"test-{uuid.uuid4().hex}:keys"
    made: list[BlockingRedisKeyStore] = []

    def make(url: str, *, namespace: str = namespace, **options: float) -> BlockingRedisKeyStore:
        store = BlockingRedisKeyStore.from_url(url, namespace=namespace, **options)
        made.append(store)
        return store

    yield make
    for store in made:
        store.close()


@pytest.fixture
def default_namespace(redis_server: RedisServer) -> Iterator[str]:
    """The session server's URL with the default namespace emptied before and after: for
    tests of `serving keys --redis-url` and the gateway, which always use that namespace."""

    def empty() -> None:
        client = Redis.from_url(redis_server.url)
        try:
            names = list(client.scan_iter(match="{" + DEFAULT_NAMESPACE + "}:*"))
            if names:
                client.delete(*names)
        finally:
            client.close()

    empty()
    yield redis_server.url
    empty()
