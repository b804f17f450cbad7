"""A key's priority class reaches vLLM as the request's `priority` with --engine-priority,
and only then; a client's own priority never does (refused, docs/gateway.md); a batch line's
is past every key's class (docs/batches.md)."""

from __future__ import annotations

import uuid

import pytest

from serving.gateway.completions import BATCH_PRIORITY
from serving.gateway.keys import SqliteKeyStore
from serving.gateway.keys.record import MAX_PRIORITY, KeySpec
from tests.gateway.batches.helpers import run_batch
from tests.gateway.conftest import GatewayFactory
from tests.gateway.fake_upstream import FakeUpstream
from tests.gateway.servers import TEST_KEY
from tests.gateway.test_completions import body, post

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize("on", [True, False])
def test_the_keys_priority_is_sent_only_with_engine_priority(
    make_gateway: GatewayFactory,
    keys: SqliteKeyStore,
    upstream: FakeUpstream,
    token: str,
    on: bool,
) -> None:
    gateway = make_gateway(keys_db=str(keys.path), engine_priority=on)
    _, urgent = keys.create(KeySpec("urgent", priority=-5))
    _, plain = keys.create(KeySpec("plain"))
    for secret in (urgent, plain, TEST_KEY):
        for stream in (False, True):
            response = post(gateway, secret, body(max_tokens=2, stream=stream), token)
            assert response.status_code == 200, response.text
    sent = [request.get("priority") for request in upstream.received(token)]
    assert sent == ([-5, -5] if on else [None, None]) + [None] * 4


def test_a_clients_own_priority_is_refused_whatever_its_key(
    make_gateway: GatewayFactory, keys: SqliteKeyStore, upstream: FakeUpstream, token: str
) -> None:
    gateway = make_gateway(keys_db=str(keys.path), engine_priority=True)
    _, urgent = keys.create(KeySpec("urgent", priority=-5))
    refused = post(gateway, urgent, body(max_tokens=2, priority=-100), token)
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "priority"
    # 0 is vLLM's default: accepted, and the key's class is what vLLM gets
    assert post(gateway, urgent, body(max_tokens=2, priority=0), token).status_code == 200
    assert [request.get("priority") for request in upstream.received(token)] == [-5]


@pytest.mark.parametrize("on", [True, False])
def test_a_batch_line_is_sent_below_every_keys_class_with_engine_priority(
    make_gateway: GatewayFactory, keys: SqliteKeyStore, upstream: FakeUpstream, on: bool
) -> None:
    gateway = make_gateway(keys_db=str(keys.path), engine_priority=on)
    _, urgent = keys.create(KeySpec("urgent", priority=-5))
    content = uuid.uuid4().hex  # batch lines carry no ?t= token: found by their message
    batch = run_batch(gateway, urgent, content)
    assert batch["request_counts"] == {"total": 2, "completed": 2, "failed": 0}
    sent = [
        request.get("priority")
        for request in upstream.received("-")
        # "-" holds every untagged body the session's fake upstream got, from other tests too
        if request.get("messages") == [{"role": "user", "content": content}]
    ]
    assert sent == ([BATCH_PRIORITY] * 2 if on else [None, None])
    assert BATCH_PRIORITY > MAX_PRIORITY  # after the lowest class a key can have
