"""Quotas and keys against real vLLM on the tiny model (docs/architecture.md,
reliability cases 4, 5, 14, 15, 17 and 18).

Keys are created the way an operator does, with `serving keys create --store` on the key
store the stack's gateway reads; charges are read back from the gateway's metrics port
(`gateway_tokens_total` is what was charged), the engine's state from vLLM's own /metrics.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.integration.conftest import (
    MODEL,
    REPO,
    Samples,
    Stack,
    eventually,
    read_tokens,
    scrape,
    serving_env,
    total,
)
from tests.integration.test_disconnect import (
    ATTEMPTS,
    engine_state,
    finished,
    generated,
    running_requests,
)

LONG: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Tell me a long story."}]
SHORT: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Tell me about the weather."}
]
_CREATED = re.compile(r"created (key_[0-9a-f]{8})")
_SECRET = re.compile(r"secret: (sk-\S+)")


def create_key(stack: Stack, name: str, *limits: str) -> tuple[str, str]:
    """`serving keys create` on the stack's key store; returns (key id, secret)."""
    out = subprocess.run(
        [sys.executable, "-m", "serving.cli", "keys", "create", "--store", str(stack.keys_db),
         "--name", name, *limits],
        env=serving_env(), cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    created, secret = _CREATED.search(out), _SECRET.search(out)
    assert created and secret, out
    return created.group(1), secret.group(1)


def gateway_metrics(stack: Stack) -> Samples:
    """Every series of the stack's gateway, from its metrics port."""
    return scrape(stack.gateway_metrics_url)


def charged(stack: Stack, key_id: str, kind: str) -> float:
    labels = frozenset({"key": key_id, "model": MODEL, "kind": kind}.items())
    return gateway_metrics(stack).get(("gateway_tokens_total", labels), 0.0)


def gauge(stack: Stack, name: str) -> float:
    return gateway_metrics(stack).get((name, frozenset()), 0.0)


def idle(stack: Stack) -> bool:
    if running_requests(stack.engine_url) != 0:
        return False
    metrics = gateway_metrics(stack)  # one scrape for both gauges
    no_labels: frozenset[tuple[str, str]] = frozenset()
    return (
        metrics.get(("gateway_in_flight_requests", no_labels), 0.0) == 0
        and metrics.get(("gateway_quota_leases", no_labels), 0.0) == 0
    )


def client(stack: Stack, secret: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.gateway_url}/v1", api_key=secret, max_retries=0)


# -- case 4: disconnect mid-stream -------------------------------------------------------


def test_disconnect_mid_stream_frees_slot_and_engine_and_charges_once(stack: Stack) -> None:
    for _ in range(ATTEMPTS):
        # A key per try: a try the engine outran was charged its whole length.
        key_id, secret = create_key(stack, "case-4", "--max-concurrency", "1")
        eventually(lambda: idle(stack))
        prompts = total(scrape(stack.engine_url), "vllm:prompt_tokens_total")
        lengths = finished(stack.engine_url, "length")
        stream = client(stack, secret).chat.completions.create(
            model=MODEL, messages=LONG, max_tokens=1800, stream=True,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        assert read_tokens(stream) == 3
        # vLLM sets its gauges after each engine step: wait for one, never read one sample.
        # On a stalled machine vLLM can make all 1,800 tokens before this process looks (a
        # clean-clone run saw it): such a try proves nothing about disconnecting, ask again.
        if engine_state(stack.engine_url, lengths) == "running":
            break
        stream.close()
    else:
        pytest.fail(f"vLLM finished all 1800 tokens before the first look, {ATTEMPTS} times")
    stream.close()
    eventually(lambda: idle(stack))
    completion = charged(stack, key_id, "completion")
    assert 3 <= completion < 1800  # what was relayed, not the reservation
    # vLLM's own prompt count (from the running usage), not the gateway's estimate.
    prompt = total(scrape(stack.engine_url), "vllm:prompt_tokens_total") - prompts
    assert charged(stack, key_id, "prompt") == prompt > 0
    time.sleep(1)
    assert charged(stack, key_id, "completion") == completion  # charged once
    # The slot is free again (the key allows one request at a time).
    reply = client(stack, secret).chat.completions.create(model=MODEL, messages=SHORT, max_tokens=4)
    assert reply.usage is not None and reply.usage.completion_tokens <= 4


def test_a_stream_the_client_stopped_reading_is_charged_what_vllm_generated(stack: Stack) -> None:
    """vLLM does not wait for a slow reader: it goes on generating and merges what the
    gateway has not read yet into its next event. A client that stops reading and closes
    once the engine is done must be charged what vLLM made, not what reached it."""
    key_id, secret = create_key(stack, "case-4-unread", "--max-concurrency", "1")
    url = stack.engine_url
    eventually(lambda: idle(stack))
    before = generated(url)
    body = json.dumps({"model": MODEL, "messages": LONG, "max_tokens": 1800, "n": 8,
                       "ignore_eos": True, "stream": True}).encode()  # fmt: skip
    host, port = stack.gateway_url.removeprefix("http://").split(":")
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting
        sock.connect((host, int(port)))
        head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\n"
                f"Authorization: Bearer {secret}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n")  # fmt: skip
        sock.sendall(head.encode() + body)
        assert sock.recv(12).startswith(b"HTTP/1.1 200")
        # 14,400 tokens of SSE are megabytes: far more than the sockets hold unread.
        eventually(lambda: generated(url) - before >= 8 * 1800, budget_s=120)
    eventually(lambda: idle(stack))
    assert charged(stack, key_id, "completion") == generated(url) - before == 8 * 1800


# -- case 5: disconnect before the first token, or on a non-streaming call ---------------


def test_disconnect_on_a_non_streaming_call(stack: Stack) -> None:
    key_id, secret = create_key(stack, "case-5-json", "--max-concurrency", "1")
    payload = {"model": MODEL, "messages": LONG, "max_tokens": 1800, "ignore_eos": True}
    try:
        early = httpx.post(
            f"{stack.gateway_url}/v1/chat/completions", json=payload, timeout=0.5,
            headers={"Authorization": f"Bearer {secret}"},
        )  # fmt: skip
    except httpx.TimeoutException:
        pass  # the client gave up mid-generation, as it should here
    else:  # say what came back instead (this failed once in CI, unexplained)
        pytest.fail(f"answered within 0.5 s: {early.status_code} {early.text[:300]}")
    eventually(lambda: idle(stack))
    # Nothing was seen, so the reservation is charged: never less than vLLM could have made.
    assert charged(stack, key_id, "completion") == 1800
    reply = client(stack, secret).chat.completions.create(model=MODEL, messages=SHORT, max_tokens=2)
    assert reply.choices


def test_disconnect_before_the_first_token(stack: Stack) -> None:
    # A try in which vLLM made all 1,800 tokens before the gateway acted on the close (this
    # process or the gateway not scheduled meanwhile, see test_disconnect.ATTEMPTS) is
    # recognised by vLLM's count of requests finished at their length; the test asks again.
    for attempt in range(ATTEMPTS):
        key_id, secret = create_key(stack, f"case-5-stream-{attempt}", "--max-concurrency", "1")
        lengths = finished(stack.engine_url, "length")
        payload = {"model": MODEL, "messages": LONG, "max_tokens": 1800, "ignore_eos": True,
                   "stream": True}  # fmt: skip
        headers = {"Authorization": f"Bearer {secret}"}
        with (
            httpx.Client(timeout=30) as http,
            http.stream("POST", f"{stack.gateway_url}/v1/chat/completions", json=payload,
                        headers=headers) as response,
        ):  # fmt: skip
            assert response.status_code == 200  # headers only; no body read
        eventually(lambda: idle(stack))
        if finished(stack.engine_url, "length") == lengths:
            break
    else:
        pytest.fail(f"vLLM made all 1800 tokens before the close took effect, {ATTEMPTS} times")
    assert charged(stack, key_id, "completion") < 1800
    assert gauge(stack, "gateway_quota_leases") == 0


# -- case 14: prompt over the context --------------------------------------------------------


def test_prompt_over_the_context_is_vllms_400_and_charges_nothing(stack: Stack) -> None:
    key_id, secret = create_key(stack, "case-14", "--tpm", "1000000")
    words = " ".join(["weather"] * 5000)
    with pytest.raises(openai.BadRequestError) as caught:
        client(stack, secret).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": words}], max_tokens=8,
        )  # fmt: skip
    assert caught.value.status_code == 400
    assert "length" in str(caught.value).lower()  # "maximum context/model length"
    eventually(lambda: idle(stack))
    assert charged(stack, key_id, "prompt") == charged(stack, key_id, "completion") == 0


# -- case 15: max_tokens missing, huge, negative, non-integer ---------------------------------


def test_max_tokens_is_capped_to_the_key_or_refused(stack: Stack) -> None:
    _, secret = create_key(stack, "case-15", "--max-tokens", "8")
    api = client(stack, secret)
    for max_tokens in (None, 10**6):
        extra = {} if max_tokens is None else {"max_tokens": max_tokens}
        reply = api.chat.completions.create(
            model=MODEL, messages=SHORT, extra_body={"ignore_eos": True, **extra},
        )  # fmt: skip
        assert reply.usage is not None and reply.usage.completion_tokens == 8
    for bad in (-1, 0, 1.5, "12"):
        with pytest.raises(openai.BadRequestError) as caught:
            api.chat.completions.create(
                model=MODEL, messages=SHORT, extra_body={"max_tokens": bad},
            )  # fmt: skip
        assert caught.value.param == "max_tokens"
    # Without a key cap, more than the model's context can hold is a 400 up front.
    with pytest.raises(openai.BadRequestError) as caught:
        stack.client(max_retries=0).chat.completions.create(
            model=MODEL, messages=SHORT, max_tokens=10**6
        )
    assert caught.value.param == "max_tokens"


# -- case 17: keys ----------------------------------------------------------------------------


def test_bad_and_revoked_keys_get_identical_401s_and_never_show_up(stack: Stack) -> None:
    key_id, secret = create_key(stack, "case-17")
    assert client(stack, secret).models.list().data
    subprocess.run(
        [sys.executable, "-m", "serving.cli", "keys", "revoke", key_id, "--store",
         str(stack.keys_db)],
        env=serving_env(), cwd=REPO, check=True, capture_output=True,
    )  # fmt: skip
    answers = set()
    for headers in ({}, {"Authorization": "Bearer"}, {"Authorization": f"Basic {secret}"},
                    {"Authorization": "Bearer sk-00000000-" + "a" * 40},
                    {"Authorization": f"Bearer {secret}"}):  # fmt: skip
        response = httpx.get(f"{stack.gateway_url}/v1/models", headers=headers, timeout=10)
        answers.add((response.status_code, response.content))
    assert len(answers) == 1
    status, body = answers.pop()
    assert status == 401 and b"invalid_api_key" in body
    # The banner in the stack's output shows the development key on purpose; the gateway's
    # own log and metrics show no key at all.
    gateway_log = Path(serving_env()["SERVING_HOME"]) / "logs" / "gateway.log"
    gateway_texts = [repr(gateway_metrics(stack))]
    if gateway_log.exists():
        gateway_texts.append(gateway_log.read_text())
    assert not any(secret in text or stack.api_key in text for text in gateway_texts)
    assert secret not in stack.output.read_text()


# -- case 18: after all of the above --------------------------------------------------------


def test_everything_returns_to_zero(stack: Stack) -> None:
    eventually(lambda: idle(stack))
