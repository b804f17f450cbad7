"""The ledger in Redis, on a real redis-server: replicas add into the same day hashes, a
batch is applied once even when its reply is lost, and each day expires with its retention."""

from __future__ import annotations

import time
import uuid

import pytest

from serving.gateway.usage_ledger import recorder as recorder_module
from serving.gateway.usage_ledger.days import expires_at, utc_day
from serving.gateway.usage_ledger.recorder import UsageRecorder
from serving.gateway.usage_ledger.redis_store import RedisUsageStore
from serving.gateway.usage_ledger.tally import UsageRow
from tests.gateway.quota.redis_server import RedisServer
from tests.gateway.quota.running import run_async
from tests.gateway.usage_ledger.test_recorder import DEADLINE_S, NOW, Record

DAY = "2026-03-01"


def store_on(server: RedisServer, namespace: str, **options: float) -> RedisUsageStore:
    return RedisUsageStore.from_url(server.url, namespace=namespace, **options)  # type: ignore[arg-type]


@pytest.fixture
def namespace() -> str:
    return f"test-{uuid.uuid4().hex}:usage"


@run_async
async def test_replicas_add_into_the_same_days(redis_server: RedisServer, namespace: str) -> None:
    one, two = store_on(redis_server, namespace), store_on(redis_server, namespace)
    await one.write(
        "w1", 1, {(DAY, "key_a", "m1"): [3, 4, 0, 0], ("2026-03-02", "key_a", "m1"): [1, 0, 0, 0]}
    )
    await two.write(
        "w2", 1, {(DAY, "key_a", "m1"): [10, 20, 0, 0], (DAY, "key_b", "m|2"): [0, 5, 0, 0]}
    )
    assert await two.read(DAY, "2026-03-02", None) == [
        UsageRow(DAY, "key_a", "m1", 13, 24),
        UsageRow(DAY, "key_b", "m|2", 0, 5),  # a model name holding '|' reads back whole
        UsageRow("2026-03-02", "key_a", "m1", 1, 0),
    ]
    assert await one.read(DAY, DAY, "key_b") == [UsageRow(DAY, "key_b", "m|2", 0, 5)]
    assert await one.read("2026-04-01", "2026-04-30", None) == []
    with redis_server.admin() as admin:
        day_hash = admin.hgetall(one.day_key(DAY))
    assert day_hash == {
        b"key_a|m1|prompt": b"13",
        b"key_a|m1|completion": b"24",
        b"key_b|m|2|completion": b"5",
    }
    await one.close()
    await two.close()


@run_async
async def test_a_batch_already_in_is_not_added_again(
    redis_server: RedisServer, namespace: str
) -> None:
    store = store_on(redis_server, namespace)
    await store.write("w1", 1, {(DAY, "key_a", "m1"): [3, 4, 0, 0]})
    await store.write("w1", 1, {(DAY, "key_a", "m1"): [3, 4, 0, 0]})
    await store.write("w1", 2, {(DAY, "key_a", "m1"): [1, 1, 0, 0]})
    assert await store.read(DAY, DAY, None) == [UsageRow(DAY, "key_a", "m1", 4, 5)]
    await store.close()


@run_async
async def test_batch_tokens_are_fields_of_their_own(
    redis_server: RedisServer, namespace: str
) -> None:
    store = store_on(redis_server, namespace)
    await store.write("w1", 1, {(DAY, "key_a", "m1"): [10, 20, 4, 0]})
    with redis_server.admin() as admin:
        assert admin.hgetall(store.day_key(DAY)) == {
            b"key_a|m1|prompt": b"10",
            b"key_a|m1|completion": b"20",
            b"key_a|m1|batch_prompt": b"4",
        }
        # A replica that does not tell batch tokens apart adds to the totals alone.
        admin.hincrby(store.day_key(DAY), "key_a|m1|prompt", 5)
        admin.hset(store.day_key(DAY), mapping={"key_b|m1|prompt": 1, "key_b|m1|completion": 2})
    assert await store.read(DAY, DAY, None) == [
        UsageRow(DAY, "key_a", "m1", 15, 20, 4, 0),
        UsageRow(DAY, "key_b", "m1", 1, 2, 0, 0),
    ]
    await store.close()


@run_async
async def test_each_day_expires_with_its_retention(
    redis_server: RedisServer, namespace: str
) -> None:
    store = store_on(redis_server, namespace, retention_days=30)
    today = utc_day(time.time())
    await store.write(
        "w1", 1, {(today, "key_a", "m1"): [1, 1, 0, 0], ("2020-01-01", "key_a", "m1"): [2, 2, 0, 0]}
    )
    with redis_server.admin() as admin:
        assert admin.expiretime(store.day_key(today)) == expires_at(today, 30)
        assert not admin.exists(store.day_key("2020-01-01"))  # long past: gone at once
        writer_ttl = admin.ttl(f"{{{namespace}}}:writer:w1")
    assert 0 < writer_ttl <= 86_400
    assert await store.read("2020-01-01", today, None) == [UsageRow(today, "key_a", "m1", 1, 1)]
    await store.close()


@run_async
async def test_a_black_holed_redis_loses_nothing_and_counts_nothing_twice(
    own_redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(recorder_module, "RETRY_FIRST_S", 0.05)
    store = RedisUsageStore.from_url(own_redis.url, timeout_s=0.2)
    recorder = UsageRecorder(store, interval_s=0.01, now=lambda: NOW)
    recorder.record(Record("key_a", "m1", 3, 4))
    assert await recorder.flush(DEADLINE_S)
    own_redis.pause()  # SIGSTOP: what is sent may run when it resumes, its reply long late
    try:
        recorder.record(Record("key_a", "m1", 10, 10))
        recorder.record(Record("key_b", "m1", 1, 1))
        assert not await recorder.flush(0.5)
        assert recorder.failures() >= 1
    finally:
        own_redis.resume()
    recorder.record(Record("key_a", "m1", 100, 100))
    assert await recorder.flush(DEADLINE_S)
    assert await recorder.read(DAY, DAY, None) == [
        UsageRow(DAY, "key_a", "m1", 113, 114),
        UsageRow(DAY, "key_b", "m1", 1, 1),
    ]
    await recorder.close()
