"""Fair sharing on the real engine (docs/fair-sharing.md).

`serving up` runs the gateway with the profile's max_num_seqs as its engine slots and fair
scheduling on: a key that floods the engine within its limits gets at most the slots minus the
reserved ones, the rest of its flood waits in the gateway (never in vLLM's first-come queue),
and another key's request finds a slot at once, at floods of half to four times the engine's
slots. Under vLLM's FCFS queue such a flood makes the quiet key wait for one of the flood's
256-token streams to end (seconds, `make bench-fairness`); here its median stays within twice
its time alone.

A second gateway on the same engine, with eight slots and a 1 s deadline, shows the deadline
and a departure on real processes: a client that reads nothing of an n = 8 stream holds all
eight (the relay waits on it), so the other key's request waits, and gets 503 or leaves,
charged nothing, never reaching vLLM.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import aiohttp
import httpx
import pytest

from serving.engine.process import http_ok
from serving.gateway.settings import GatewaySettings
from serving.models.tiny_model import MODEL_NAME as MODEL
from tests.integration.conftest import REPO, Stack, eventually, scrape, serving_env, total
from tests.integration.oracle import front
from tests.integration.test_gateway_quota import create_key, idle
from tests.ports import free_port

SLOTS = 16  # cpu-tiny's max_num_seqs, one engine
# Streams the noisy key keeps going: half, once, twice and four times the engine's slots.
FLOODS = (8, 16, 32, 64)
NOISY_TOKENS = 256
QUIET_REQUESTS = 8
# The quiet key's goal in the median (docs/fair-sharing.md): at most twice its time alone.
MEDIAN_GOAL = 2.0
# No quiet request waits for a noisy stream to end (vLLM's FCFS queue: 1.5-7.5 s here, the
# stall issue 38 reported: 4-9 s). Its tail goal, 3x alone (tens of ms), is judged run by run
# by `make bench-fairness`: one stall of a busy 2-core machine lands on one sample (2.3 s once).
STALL_BOUND_S = 3.0


def chat(max_tokens: int, *, stream: bool = True) -> dict[str, object]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"{time.monotonic()}: say something"}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": stream,
    }


@contextmanager
def flood(url: str, secret: str, streams: int, *, cut_off: bool = False) -> Iterator[None]:
    """`streams` noisy streams kept going in a thread of their own until the block ends
    (`cut_off`: the gateway is killed on the way, so the flood's client fails, as expected)."""
    stop = threading.Event()

    async def keep_going() -> None:
        headers = {"Authorization": f"Bearer {secret}"}
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector, headers=headers) as session:

            async def one_after_another() -> None:
                while not stop.is_set():
                    async with session.post(
                        f"{url}/v1/chat/completions", json=chat(NOISY_TOKENS)
                    ) as response:
                        async for _ in response.content:
                            if stop.is_set():
                                return

            await asyncio.gather(*(one_after_another() for _ in range(streams)))

    failures: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(keep_going())
        except BaseException as exc:  # reported in the test's own thread, below
            failures.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(120)
    if failures and not cut_off:
        raise AssertionError(f"the flood's client failed: {failures[0]!r}") from failures[0]


def time_to_first_token(url: str, secret: str) -> float:
    started = time.monotonic()
    with (
        httpx.Client(timeout=120) as client,
        client.stream(
            "POST", f"{url}/v1/chat/completions", json=chat(8),
            headers={"Authorization": f"Bearer {secret}"},
        ) as response,
    ):  # fmt: skip
        assert response.status_code == 200, response.read()
        first: float | None = None
        for line in response.iter_lines():  # to its end: a quiet tenant reads its answer
            if first is None and line.startswith("data: {") and '"content":"' in line:
                first = time.monotonic() - started
    assert first is not None, "the stream carried no content"
    return first


def ttfts(url: str, secret: str, count: int) -> list[float]:
    return [time_to_first_token(url, secret) for _ in range(count)]


@pytest.mark.parametrize("streams", FLOODS)
def test_a_flood_of_one_key_leaves_another_key_a_slot(stack: Stack, streams: int) -> None:
    noisy_id, noisy = create_key(stack, f"fair-noisy-{streams}")
    quiet_id, quiet = create_key(stack, f"fair-quiet-{streams}")
    reserved = GatewaySettings.model_fields["reserved_slots"].default
    assert reserved > 0
    metrics = stack.gateway_metrics_url  # the per-key series
    before = ttfts(stack.gateway_url, quiet, QUIET_REQUESTS)
    with flood(stack.gateway_url, noisy, streams):
        # the flood has every slot its key may take, and the excess waits in the gateway
        running = min(streams, SLOTS - reserved)
        eventually(
            lambda: total(scrape(stack.gateway_url), "gateway_queue_running") >= running,
            budget_s=120,
        )
        if streams > running:
            eventually(
                lambda: total(scrape(metrics), "gateway_queue_waiting", key=noisy_id) > 0,
                budget_s=120,
            )
        assert total(scrape(stack.gateway_url), "gateway_queue_slots") == SLOTS
        flooded = ttfts(stack.gateway_url, quiet, QUIET_REQUESTS)
        # None in vLLM's first-come queue: not sampled at every request (on a stalled
        # machine the flood's streams may be between two requests at the moment of a scrape)
        assert total(scrape(stack.engine_url), "vllm:num_requests_waiting") == 0
        gateway = scrape(metrics)
    # Before any assertion: a flood still draining would be counted against the next test's
    # accounting oracle.
    eventually(lambda: idle(stack), budget_s=120)
    # "Alone" on both sides of the flood: load from outside the test that comes or goes
    # meanwhile weighs on the baseline as on the flooded samples.
    alone = statistics.median(before + ttfts(stack.gateway_url, quiet, QUIET_REQUESTS))
    median, worst = statistics.median(flooded), max(flooded)
    print(
        f"{streams} noisy streams: quiet TTFT median {median * 1000:.0f} ms "
        f"({median / alone:.2f}x alone, {alone * 1000:.0f} ms), worst {worst * 1000:.0f} ms "
        f"({worst / alone:.2f}x)"
    )
    # Every quiet request found a slot without waiting for a noisy stream to end (each lasts
    # seconds); the reserved slot may still be its own previous request's for a moment after
    # that one's last byte, so a few ms of wait are not a noisy key's doing.
    requests = 2 * QUIET_REQUESTS
    assert total(gateway, "gateway_queue_wait_seconds_count", key=quiet_id) == requests
    assert total(gateway, "gateway_queue_wait_seconds_bucket", key=quiet_id, le="0.1") == requests
    assert median <= MEDIAN_GOAL * alone, (alone, flooded)
    assert worst < STALL_BOUND_S, (alone, flooded)


class OwnGateway(NamedTuple):
    url: str
    metrics: str
    """Its metrics port's URL, where the per-key series are."""
    process: subprocess.Popen[bytes]


@contextmanager
def own_gateway(
    stack: Stack, workdir: Path, *flags: str, counted: bool = True
) -> Iterator[OwnGateway]:
    """A gateway of the test's own on the stack's engine and keys (`flags` added), counted by
    the accounting oracle while it runs (unless not `counted`: a test that kills it)."""
    port, metrics_port = free_port(), free_port()
    log = workdir / f"gateway-{port}.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "serving.cli", "gateway", "--upstream", stack.engine_url,
             "--port", str(port), "--keys-db", str(stack.keys_db), "--drain-delay", "0",
             "--metrics-port", str(metrics_port), *flags],
            env=serving_env(), cwd=REPO, stdout=sink, stderr=subprocess.STDOUT,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while not http_ok(f"{url}/readyz"):
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        own = OwnGateway(url, f"http://127.0.0.1:{metrics_port}", process)
        with front(url, stack.engine_url) if counted else contextlib.nullcontext():
            yield own
    finally:
        process.terminate()
        process.wait(30)


def eight_slot_gateway(
    stack: Stack, workdir: Path, queue_timeout_s: float
) -> contextlib.AbstractContextManager[OwnGateway]:
    """A second gateway with eight slots (one request of n = 8 fills them)."""
    return own_gateway(
        stack, workdir, "--engine-slots", "8", "--reserved-slots", "0",
        "--queue-timeout-s", str(queue_timeout_s),
    )  # fmt: skip


@contextmanager
def slot_held(stack: Stack, url: str, secret: str) -> Iterator[float]:
    """The gateway's eight slots taken by a stream nobody reads (a slot per sequence), so the
    slots stay taken while the socket is open. Yields vLLM's prompt token count once that
    request runs.

    vLLM merges the deltas a lagging reader has not taken into one event, so the text of
    n=8 x 1800 tokens shrinks to a few events that fit the kernel's socket buffers (up to
    4 MiB): the stream then ended about 20 s in, with the slots free. Twenty top logprobs per
    token cannot merge away (about 17 MB), so the relay stays blocked on the 4 KiB window."""
    generated = total(scrape(stack.engine_url), "vllm:generation_tokens_total")
    body = {**chat(1800), "n": 8, "logprobs": True, "top_logprobs": 20}
    holder = raw_request(url, secret, body, rcvbuf=4096)
    try:
        eventually(lambda: total(scrape(url), "gateway_queue_running") == 8, budget_s=60)
        # its prompt is in vLLM's count once it generates
        eventually(
            lambda: total(scrape(stack.engine_url), "vllm:generation_tokens_total") > generated,
            budget_s=60,
        )
        yield total(scrape(stack.engine_url), "vllm:prompt_tokens_total")
    finally:
        holder.close()
    eventually(lambda: total(scrape(url), "gateway_queue_running") == 0, budget_s=60)


def raw_request(url: str, secret: str, body: dict[str, object], *, rcvbuf: int) -> socket.socket:
    """A request sent on a socket with a small receive buffer that nobody reads."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect((host, int(port)))
    data = json.dumps(body).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {secret}"
        f"\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    )
    sock.sendall(head.encode() + data)
    return sock


def test_a_request_waits_no_longer_than_its_deadline(stack: Stack, tmp_path: Path) -> None:
    _, holder = create_key(stack, "fair-holder")
    waiter_id, waiter = create_key(stack, "fair-waiter")
    with (
        eight_slot_gateway(stack, tmp_path, queue_timeout_s=1) as (url, metrics, _),
        slot_held(stack, url, holder) as prompts_before,
    ):
        started = time.monotonic()
        refused = httpx.post(
            f"{url}/v1/chat/completions", json=chat(8, stream=False),
            headers={"Authorization": f"Bearer {waiter}"}, timeout=60,
        )  # fmt: skip
        assert time.monotonic() - started >= 1
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "engine_overloaded"
        assert refused.headers["retry-after"]
        samples = scrape(metrics)
        assert total(samples, "gateway_queue_timeouts_total", key=waiter_id) == 1
        assert total(samples, "gateway_tokens_total", key=waiter_id) == 0  # nothing charged
        # it never reached vLLM: the only prompt vLLM took since is the holder's
        assert total(scrape(stack.engine_url), "vllm:prompt_tokens_total") == prompts_before


def test_a_client_that_leaves_while_waiting_leaves_the_queue(stack: Stack, tmp_path: Path) -> None:
    _, holder = create_key(stack, "fair-holder-2")
    leaver_id, leaver = create_key(stack, "fair-leaver")
    with (
        eight_slot_gateway(stack, tmp_path, queue_timeout_s=300) as (url, metrics, _),
        slot_held(stack, url, holder) as prompts_before,
    ):
        leaving = raw_request(url, leaver, chat(8), rcvbuf=65536)
        eventually(lambda: total(scrape(metrics), "gateway_queue_waiting", key=leaver_id) == 1)
        leaving.close()
        eventually(lambda: total(scrape(metrics), "gateway_queue_waiting", key=leaver_id) == 0)
        samples = scrape(metrics)
        assert total(samples, "gateway_queue_abandoned_total", key=leaver_id) == 1
        assert total(samples, "gateway_tokens_total", key=leaver_id) == 0
        assert total(scrape(stack.engine_url), "vllm:prompt_tokens_total") == prompts_before
