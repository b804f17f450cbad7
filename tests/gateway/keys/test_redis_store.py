"""`RedisKeyStore` on a real redis-server: what one store writes another sees after one
refresh, lookups never wait for Redis, only digests are stored, and a lost Redis leaves the
last snapshot in place."""

from __future__ import annotations

import json
import logging
import uuid
from datetime import timedelta
from urllib.parse import urlsplit

import pytest
from redis import Redis

from serving.errors import ServingError
from serving.gateway.keys import record as record_module
from serving.gateway.keys.credentials import hash_secret
from serving.gateway.keys.record import KeySpec
from serving.gateway.keys.redis_store import (
    BlockingRedisKeyStore,
    KeyStoreUnavailable,
    RedisKeyStore,
)
from serving.gateway.quota import Limits
from tests.gateway.keys.conftest import StoreFactory
from tests.gateway.quota.redis_server import RedisServer


@pytest.fixture
def url(redis_server: RedisServer) -> str:
    return redis_server.url


def test_create_get_list_round_trip(redis_keys: StoreFactory, url: str) -> None:
    store = redis_keys(url)
    record, secret = store.create(
        KeySpec(
            "team-a",
            limits=Limits(rpm=60, tpm=20_000, max_tokens=512),
            models=["m1", "m2"],
            model_limits={"m1": Limits(rpm=5)},
            weight=4,
            default_adapter="m1",
        )
    )
    assert (record.weight, record.default_adapter) == (4, "m1")
    assert record.secret_sha256 == hash_secret(secret)
    assert not record.revoked
    assert store.get(record.key_id) == record  # its own write, at once
    other, _ = store.create(KeySpec("team-b"), now=record.created_at + timedelta(seconds=1))
    assert store.list_keys() == [record, other]  # oldest first
    assert store.get("key_00000000") is None
    assert store.authenticate(secret) == record
    fresh = redis_keys(url)
    assert fresh.refresh()
    assert fresh.list_keys() == [record, other]  # limits, models, model limits and all


def test_a_key_created_by_one_store_authenticates_on_another_after_a_refresh(
    redis_keys: StoreFactory, url: str
) -> None:
    cli, gateway = redis_keys(url), redis_keys(url)
    assert not gateway.loaded
    assert gateway.refresh() and gateway.loaded and gateway.list_keys() == []
    record, secret = cli.create(KeySpec("team-a"))
    assert gateway.authenticate(secret) is None  # not until it refreshes: no I/O per lookup
    assert gateway.refresh()
    assert gateway.authenticate(secret) == record
    assert not gateway.refresh()  # nothing changed: no reload


def test_a_revocation_is_seen_by_another_store_within_one_refresh(
    redis_keys: StoreFactory, url: str
) -> None:
    cli, gateway = redis_keys(url), redis_keys(url)
    record, secret = cli.create(KeySpec("team-a"))
    gateway.refresh()
    assert gateway.authenticate(secret) == record
    assert cli.revoke(record.key_id).revoked
    assert cli.authenticate(secret) is None  # the writer sees its own revocation at once
    assert gateway.authenticate(secret) == record  # the other one: at its next refresh
    assert gateway.refresh()
    assert gateway.authenticate(secret) is None
    revoked = gateway.get(record.key_id)
    assert revoked is not None and revoked.revoked


def test_authenticate_rejects_wrong_malformed_unknown_and_revoked(
    redis_keys: StoreFactory, url: str
) -> None:
    store = redis_keys(url)
    record, secret = store.create(KeySpec("team-a"))
    wrong = secret[:-1] + ("a" if secret[-1] != "a" else "b")
    assert store.authenticate(wrong) is None
    assert store.authenticate("not a key") is None
    assert store.authenticate("sk-00000000-" + "a" * 40) is None
    store.revoke(record.key_id)
    assert store.authenticate(secret) is None


def test_revoke_twice_is_fine_and_an_unknown_id_is_an_error(
    redis_keys: StoreFactory, url: str
) -> None:
    store = redis_keys(url)
    record, _ = store.create(KeySpec("team-a"))
    assert store.revoke(record.key_id).revoked
    assert store.revoke(record.key_id).revoked
    with pytest.raises(ServingError, match=r"key id 'key_00000000': no such key in Redis at "):
        store.revoke("key_00000000")


def test_create_validates_its_fields(redis_keys: StoreFactory, url: str) -> None:
    store = redis_keys(url)
    with pytest.raises(ServingError, match=r"^name must be a non-empty string"):
        store.create(KeySpec("  "))
    with pytest.raises(ServingError, match=r"^model_limits: model 'm9' is not in the key's models"):
        store.create(KeySpec("x", models=["m1"], model_limits={"m9": Limits(rpm=1)}))
    store.refresh()
    assert store.list_keys() == []


def test_id_collisions_draw_a_new_id(
    redis_keys: StoreFactory, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = redis_keys(url)
    first, first_secret = store.create(KeySpec("a"))
    draws = iter(
        [
            (first.key_id, "sk-" + first.key_id[4:] + "-" + "a" * 40),
            ("key_0000abcd", "sk-0000abcd-" + "b" * 40),
        ]
    )
    monkeypatch.setattr(record_module, "new_secret", lambda: next(draws))
    second, secret = store.create(KeySpec("b"))
    assert second.key_id == "key_0000abcd"
    assert store.authenticate(secret) == second
    assert store.authenticate(first_secret) == first  # the taken id was not overwritten


def test_only_digests_are_in_redis(redis_keys: StoreFactory, own_redis: RedisServer) -> None:
    store = redis_keys(own_redis.url)
    secrets = [store.create(KeySpec(f"key-{n}", limits=Limits(rpm=n + 1)))[1] for n in range(5)]
    store.revoke(store.list_keys()[0].key_id)
    client = Redis.from_url(own_redis.url, decode_responses=True)
    try:
        stored: list[object] = []
        for name in client.scan_iter():
            stored.append(name)
            kind = client.type(name)
            if kind == "hash":
                stored += [item for pair in client.hgetall(name).items() for item in pair]
            elif kind == "set":
                stored += client.smembers(name)
            else:
                assert kind == "string", name
                stored.append(client.get(name))
    finally:
        client.close()
    everything = "\n".join(map(str, stored))
    for secret in secrets:
        assert secret not in everything
        assert secret.rsplit("-", 1)[1] not in everything  # nor its random part
        assert hash_secret(secret) in everything


def test_the_snapshot_stays_while_redis_is_gone(
    redis_keys: StoreFactory, own_redis: RedisServer
) -> None:
    cli, gateway = redis_keys(own_redis.url), redis_keys(own_redis.url, timeout_s=1.0)
    record, secret = cli.create(KeySpec("team-a"))
    gateway.refresh()
    own_redis.kill()
    with pytest.raises(KeyStoreUnavailable) as raised:
        gateway.refresh()
    message = str(raised.value)
    assert message.startswith(f"Redis at 127.0.0.1:{own_redis.port}/0 is unavailable (")
    assert str(urlsplit(own_redis.url).password) not in message
    assert gateway.authenticate(secret) == record
    assert gateway.list_keys() == [record]
    # A Redis that comes back empty (these tests give it no persistence) holds no keys, and
    # the next refresh says so: the version it reads is not the one the snapshot has.
    own_redis.start()
    assert gateway.refresh()
    assert gateway.authenticate(secret) is None and gateway.list_keys() == []


def test_a_wrong_password_is_unavailable_without_showing_it(own_redis: RedisServer) -> None:
    password = str(urlsplit(own_redis.url).password)
    url = own_redis.url.replace(password, "wrong-" + password)
    store = BlockingRedisKeyStore.from_url(url)
    try:
        with pytest.raises(KeyStoreUnavailable, match=r"WRONGPASS") as raised:
            store.refresh()
    finally:
        store.close()
    assert password not in str(raised.value)
    assert raised.value.__cause__ is None and raised.value.__suppress_context__


@pytest.mark.parametrize(
    "url",
    [
        "http://:hunter2@redis:6379",
        "redis://:hunter2@redis:port",
        "redis://:hunter2",  # redis-py's own message would quote this "port"
        "redis://:hunter2@[::1",
    ],
)
def test_a_bad_url_is_an_error_that_does_not_quote_it(url: str) -> None:
    with pytest.raises(ServingError, match=r"^not a valid Redis URL \(expected ") as raised:
        RedisKeyStore.from_url(url)
    assert "hunter2" not in str(raised.value)


def test_a_record_that_does_not_parse_is_left_out_and_the_rest_load(
    redis_keys: StoreFactory, url: str, caplog: pytest.LogCaptureFixture
) -> None:
    namespace = f"test-{uuid.uuid4().hex}"
    store = redis_keys(url, namespace=namespace)
    good, good_secret = store.create(KeySpec("good"))
    bad, bad_secret = store.create(KeySpec("bad"))
    records = "{" + namespace + "}:records"  # the layout the module docstring describes
    client = Redis.from_url(url, decode_responses=True)
    try:
        client.hset(records, bad.key_id, f'{{"id": "{bad.key_id}", "name": 7}}')
        client.hset(records, "key_0000ffff", "not json")
        client.hset(records, "key_0000eeee", json.dumps(good.to_document()))  # another's
        client.set("{" + namespace + "}:version", "moved")
    finally:
        client.close()
    other = redis_keys(url, namespace=namespace)
    with caplog.at_level(logging.ERROR):
        assert other.refresh()
    assert other.authenticate(good_secret) == good
    assert other.authenticate(bad_secret) is None  # fails closed
    assert [record.key_id for record in other.list_keys()] == [good.key_id]
    assert f"leaving out key {bad.key_id!r}" in caplog.text
    assert "leaving out key 'key_0000ffff'" in caplog.text
    assert f"leaving out key 'key_0000eeee': its record in Redis names {good.key_id!r}" in (
        caplog.text
    )
    assert good_secret not in caplog.text and bad_secret not in caplog.text
