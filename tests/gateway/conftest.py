"""Fixtures for gateway tests: one fake upstream and one redis-server per session, gateways
per test.

gateway = make_gateway(keys_db=str(keys.path), clock=clock)   # key store + manual time
record, secret = keys.create(KeySpec("team", limits=Limits(max_concurrency=2)))
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from serving.gateway.keys import SqliteKeyStore
from serving.gateway.quota import Clock
from serving.gateway.settings import GatewaySettings
from tests.gateway.fake_upstream import FAKE_ROUTES, FakeUpstream
from tests.gateway.quota.redis_server import RedisServer
from tests.gateway.servers import TEST_KEY, GatewayServer

GatewayFactory = Callable[..., GatewayServer]


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The tiny model's tokenizer trained on a small vocabulary, which makes more tokens of
    the same text: the harder case for a prompt estimate's bound."""
    from transformers import AutoTokenizer

    from serving.models import tiny_tokenizer as tt

    out = tmp_path_factory.mktemp("tok")
    tt.save_tokenizer(tt.train_tokenizer(tt.read_corpus(), vocab_size=300), out, model_max_length=1)
    return AutoTokenizer.from_pretrained(out)


@pytest.fixture(scope="session")
def upstream() -> Iterator[FakeUpstream]:
    fake = FakeUpstream()
    fake.start()
    yield fake
    fake.stop()


def start_gateway(
    upstream_url: str,
    *,
    clock: Clock | None = None,
    api_keys: tuple[str, ...] = (TEST_KEY,),
    access_log: bool = False,
    **options: object,
) -> GatewayServer:
    """A started gateway for `upstream_url`; `options` override `GatewaySettings` fields.
    Its route table also serves the fake upstream's fault paths, free (`FAKE_ROUTES`)."""
    defaults: dict[str, object] = {"upstream_idle_timeout_s": 5.0, "graceful_shutdown_s": 1}
    defaults.update(options)
    settings = GatewaySettings.create(upstream=upstream_url, api_keys=api_keys, **defaults)
    server = GatewayServer(settings, clock=clock, access_log=access_log, routes=FAKE_ROUTES)
    server.start()
    return server


@pytest.fixture(scope="module")
def gateway(upstream: FakeUpstream) -> Iterator[GatewayServer]:
    """A gateway with default settings, shared by a test module."""
    server = start_gateway(upstream.url)
    yield server
    server.stop()


@pytest.fixture
def make_gateway(upstream: FakeUpstream) -> Iterator[GatewayFactory]:
    """Start a gateway with other settings (`upstream=` too), stopped after the test."""
    started: list[GatewayServer] = []

    def make(
        *,
        clock: Clock | None = None,
        api_keys: tuple[str, ...] = (TEST_KEY,),
        access_log: bool = False,
        **options: object,
    ) -> GatewayServer:
        url = str(options.pop("upstream", upstream.url))
        server = start_gateway(
            url, clock=clock, api_keys=api_keys, access_log=access_log, **options
        )
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()


@pytest.fixture
def token() -> str:
    """A fresh token that keys the fake upstream's gates and events for one test."""
    return uuid.uuid4().hex


@pytest.fixture
def keys(tmp_path: Path) -> Iterator[SqliteKeyStore]:
    """An empty key store; pass `keys_db=str(keys.path)` to `make_gateway`."""
    store = SqliteKeyStore(tmp_path / "keys.db")
    yield store
    store.close()


@pytest.fixture
def path(tmp_path: Path) -> Path:
    """Where a test's keys.db goes (the budget journal and the usage ledger share it)."""
    return tmp_path / "keys.db"


@pytest.fixture
def engines() -> Iterator[tuple[FakeUpstream, FakeUpstream]]:
    """Two fake engines of the test's own, for a gateway over several upstreams."""
    pair = (FakeUpstream(), FakeUpstream())
    for engine in pair:
        engine.start()
    yield pair
    for engine in pair:
        engine.stop()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One redis-server for the session: each test empties it first (`flush`) or works under a
    namespace of its own; a test that stops or kills one starts its own (`own_redis`)."""
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test's own, free to be paused, killed and started again."""
    server = RedisServer(tmp_path / "redis")
    server.start()
    yield server
    server.stop()


def eventually(check: Callable[[], bool], timeout: float = 5.0) -> bool:
    """True as soon as `check()` is, False if it never was within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.fixture
def strict(make_gateway: GatewayFactory, keys: SqliteKeyStore) -> GatewayServer:
    """A gateway with a key store, a 1000-byte body limit and 0.3 s read deadlines."""
    return make_gateway(
        keys_db=str(keys.path), max_body_bytes=1000, header_timeout_s=0.3, body_timeout_s=0.3
    )
