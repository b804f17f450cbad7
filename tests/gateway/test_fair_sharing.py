"""Fair sharing in the gateway (docs/fair-sharing.md): requests past the engines' slots wait
in the gateway, leave at their deadline or when their client does, and are charged nothing
unless they ran. The fake upstream's `gated` model holds a request until the test lets go."""

from __future__ import annotations

import socket
import threading

import httpx

from serving.gateway.keys import KeyRecord, SqliteKeyStore
from serving.gateway.keys.record import KeySpec
from serving.gateway.quota import Limits
from tests.gateway.conftest import GatewayFactory, eventually
from tests.gateway.fake_upstream import FakeUpstream
from tests.gateway.scrape import key_usage, scrape, settled, value
from tests.gateway.servers import GatewayServer

GATED = {"model": "gated", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
LIMITS = Limits(rpm=100, tpm=100_000, max_concurrency=10)


def post(gateway: GatewayServer, secret: str, token: str, results: list[httpx.Response]) -> None:
    with httpx.Client(timeout=30) as client:
        results.append(
            client.post(
                f"{gateway.url}/v1/chat/completions?t={token}",
                json=GATED,
                headers={"Authorization": f"Bearer {secret}"},
            )
        )


def in_background(*args: object) -> threading.Thread:
    thread = threading.Thread(target=post, args=args, daemon=True)
    thread.start()
    return thread


def waiting(gateway: GatewayServer, key_id: str) -> float:
    return value(scrape(gateway), "gateway_queue_waiting", key=key_id)


def one_slot_taken(
    make_gateway: GatewayFactory,
    keys: SqliteKeyStore,
    upstream: FakeUpstream,
    token: str,
    **options: object,
) -> tuple[
    GatewayServer,
    tuple[KeyRecord, str],
    tuple[KeyRecord, str],
    threading.Thread,
    list[httpx.Response],
]:
    """A gateway with one slot, taken by the `noisy` key's gated request (running in a
    thread, its response appended to the list once the test releases the gate), and a
    `quiet` key to send the request that has to wait."""
    gateway = make_gateway(keys_db=str(keys.path), engine_slots=1, reserved_slots=0, **options)
    noisy, quiet = (keys.create(KeySpec(name, limits=LIMITS)) for name in ("noisy", "quiet"))
    results: list[httpx.Response] = []
    holder = in_background(gateway, noisy[1], token, results)
    assert eventually(lambda: len(upstream.received(token)) == 1, timeout=30)
    return gateway, noisy, quiet, holder, results


def test_past_the_slots_a_request_waits_and_runs_when_one_frees(
    make_gateway: GatewayFactory, keys: SqliteKeyStore, upstream: FakeUpstream, token: str
) -> None:
    gateway, (noisy, _), (quiet, quiet_secret), first, results = one_slot_taken(
        make_gateway, keys, upstream, token
    )
    second = in_background(gateway, quiet_secret, token, results)
    assert eventually(lambda: waiting(gateway, quiet.key_id) == 1, timeout=30)
    assert len(upstream.received(token)) == 1  # it waits in the gateway, not in the engine
    assert key_usage(gateway, quiet.key_id)[0] == 1  # admitted: its slot of concurrency is held
    upstream.release(token)
    first.join(10)
    second.join(10)
    assert [response.status_code for response in results] == [200, 200]
    assert len(upstream.received(token)) == 2
    assert settled(gateway)
    samples = scrape(gateway)
    assert value(samples, "gateway_queue_slots") == 1
    assert value(samples, "gateway_queue_wait_seconds_count", key=quiet.key_id) == 1
    assert value(samples, "gateway_queue_wait_seconds_bucket", key=noisy.key_id, le="0.005") == 1


def test_a_request_that_waits_past_its_deadline_gets_503_and_is_charged_nothing(
    make_gateway: GatewayFactory, keys: SqliteKeyStore, upstream: FakeUpstream, token: str
) -> None:
    gateway, _, (quiet, quiet_secret), first, results = one_slot_taken(
        make_gateway, keys, upstream, token, queue_timeout_s=0.3
    )
    refusals: list[httpx.Response] = []
    post(gateway, quiet_secret, token, refusals)
    refused = refusals[0]
    assert refused.status_code == 503
    assert refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["code"] == "engine_overloaded"
    assert key_usage(gateway, quiet.key_id) == (0, 0, 0, 0)  # not even the request counted
    assert value(scrape(gateway), "gateway_queue_timeouts_total", key=quiet.key_id) == 1
    upstream.release(token)
    first.join(10)
    assert results[0].status_code == 200
    assert settled(gateway)


def test_a_client_that_leaves_while_waiting_is_charged_nothing(
    make_gateway: GatewayFactory, keys: SqliteKeyStore, upstream: FakeUpstream, token: str
) -> None:
    gateway, _, (quiet, quiet_secret), first, _ = one_slot_taken(
        make_gateway, keys, upstream, token
    )
    body = httpx.Request(
        "POST",
        f"{gateway.url}/v1/chat/completions?t={token}",
        json=GATED,
        headers={"Authorization": f"Bearer {quiet_secret}", "Host": "x"},
    )
    head = f"POST /v1/chat/completions?t={token} HTTP/1.1\r\n" + "".join(
        f"{name}: {value}\r\n" for name, value in body.headers.items()
    )
    with socket.create_connection(("127.0.0.1", gateway.port)) as sock:
        sock.sendall(head.encode() + b"\r\n" + body.read())
        assert eventually(lambda: waiting(gateway, quiet.key_id) == 1, timeout=30)
    assert eventually(lambda: waiting(gateway, quiet.key_id) == 0, timeout=30)
    assert value(scrape(gateway), "gateway_queue_abandoned_total", key=quiet.key_id) == 1
    assert key_usage(gateway, quiet.key_id) == (0, 0, 0, 0)
    upstream.release(token)
    first.join(10)
    assert len(upstream.received(token)) == 1  # the one that left never reached the engine
    assert settled(gateway)


def test_a_key_weight_divides_what_it_is_counted_as_served(
    make_gateway: GatewayFactory, keys: SqliteKeyStore
) -> None:
    gateway = make_gateway(keys_db=str(keys.path), engine_slots=4)
    record, secret = keys.create(KeySpec("heavy", limits=LIMITS, weight=4))
    body = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    with httpx.Client(timeout=30) as client:
        response = client.post(
            f"{gateway.url}/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {secret}"},
        )
    assert response.status_code == 200
    assert settled(gateway)
    charged = key_usage(gateway, record.key_id)[2]
    assert charged > 0
    queue = gateway.app.queue
    assert queue is not None
    assert gateway.in_loop(lambda: queue.virtual(record.key_id)) == charged / 4


def test_a_request_takes_a_slot_per_sequence_and_one_wider_than_a_keys_share_is_a_400(
    make_gateway: GatewayFactory, keys: SqliteKeyStore, upstream: FakeUpstream, token: str
) -> None:
    # vLLM runs n x prompts sequences at once: the queue counts every one of them.
    gateway = make_gateway(keys_db=str(keys.path), engine_slots=4, reserved_slots=1)
    _, secret = keys.create(KeySpec("wide", limits=LIMITS))
    headers = {"Authorization": f"Bearer {secret}"}
    with httpx.Client(base_url=gateway.url, headers=headers, timeout=30) as client:
        for path, body, param in (
            ("/v1/chat/completions", {**GATED, "model": "fake", "n": 4}, "n"),
            ("/v1/completions", {"model": "fake", "prompt": ["a"] * 4, "max_tokens": 5}, "prompt"),
            ("/v1/completions", {"model": "fake", "prompt": ["a"] * 2, "n": 2, "max_tokens": 5},
             "n"),
        ):  # fmt: skip
            refused = client.post(path, json=body)
            assert refused.status_code == 400, refused.text
            assert refused.json()["error"]["param"] == param
            assert "at most 3" in refused.json()["error"]["message"]
    results: list[httpx.Response] = []

    def wide() -> None:
        body = {**GATED, "n": 3}
        url = f"{gateway.url}/v1/chat/completions?t={token}"
        results.append(httpx.post(url, json=body, headers=headers, timeout=30))

    thread = threading.Thread(target=wide, daemon=True)
    thread.start()
    assert eventually(lambda: len(upstream.received(token)) == 1, timeout=30)
    assert value(scrape(gateway), "gateway_queue_running") == 3
    upstream.release(token)
    thread.join(10)
    assert results[0].status_code == 200
    assert settled(gateway)
    assert value(scrape(gateway), "gateway_queue_running") == 0
