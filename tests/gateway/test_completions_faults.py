"""One owner per request: an exception at any step of a metered handler reaches the client as
an OpenAI error (a JSON body, or a final SSE error event once a stream has started) and gives
back everything the request held: its quota lease, its fair-queue slots, the in-flight count.

Each case replaces one step of the path with one that raises, as a bug or an exception type
nobody expected would (the 500s of issue 36 leaked a lease and a queue slot for good)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from serving.gateway import completions
from serving.gateway.fair_queue import FairQueue
from serving.gateway.proxy import Proxy
from serving.gateway.quota import QuotaEngine
from serving.gateway.routing import Router
from serving.gateway.usage import ResponseMeter
from tests.gateway.conftest import GatewayFactory, eventually
from tests.gateway.scrape import idle, scrape, value
from tests.gateway.servers import GatewayServer, http_client

MESSAGES = [{"role": "user", "content": "hi"}]


class Injected(RuntimeError):
    """The fault the test puts into a step."""


def _raise(*_: object, **__: object) -> Any:
    raise Injected("injected fault")


async def _raise_async(*_: object, **__: object) -> Any:
    raise Injected("injected fault")


# step -> (object, attribute, replacement, whether the client's answer was complete before it)
STEPS: dict[str, tuple[object, str, object, bool]] = {
    "parse": (completions, "parse_completion_request", _raise, False),
    "admit": (QuotaEngine, "admit", _raise_async, False),
    "check": (completions, "check_admitted", _raise, False),
    "wait": (FairQueue, "try_turn", _raise, False),
    "route": (Router, "choose", _raise, False),
    "render": (completions, "render_upstream_body", _raise, False),
    "forward": (Proxy, "forward", _raise_async, False),
    "relay": (ResponseMeter, "feed", _raise, False),
    "read": (ResponseMeter, "read_json", _raise, False),
    "settle": (QuotaEngine, "settle", _raise_async, True),
    "record": (completions, "_record_outcome", _raise, True),
}


@pytest.fixture
def gateway(make_gateway: GatewayFactory) -> Iterator[GatewayServer]:
    # fair sharing on, so every step of the path runs
    yield make_gateway(engine_slots=4, reserved_slots=1)


def _everything_returned(gateway: GatewayServer) -> bool:
    samples = scrape(gateway)
    app = gateway.app
    return (
        idle(gateway)
        and value(samples, "gateway_queue_running") == 0
        and not app.completions._leases_running
    )


PROMPTS: dict[str, dict[str, object]] = {
    "/v1/chat/completions": {"messages": MESSAGES, "max_tokens": 5},
    "/v1/completions": {"prompt": "hi", "max_tokens": 5},
    "/v1/responses": {"input": "hi", "max_output_tokens": 5},
}

# Streams are fed to the meter event by event; whole bodies are read at once.
CASES = [
    (step, stream, path)
    for step in sorted(STEPS)
    for stream in (False, True)
    for path in PROMPTS
    if not (step == "relay" and not stream) and not (step == "read" and stream)
]


@pytest.mark.parametrize(("step", "stream", "path"), CASES)
def test_a_fault_at_any_step_is_an_openai_error_and_gives_everything_back(
    gateway: GatewayServer, monkeypatch: pytest.MonkeyPatch, step: str, stream: bool, path: str
) -> None:
    owner, name, replacement, answered = STEPS[step]
    body = {"model": "fake", **PROMPTS[path], "stream": stream}
    with http_client(gateway.url) as http:
        assert http.post(path, json=body).status_code == 200  # healthy
        assert eventually(lambda: _everything_returned(gateway))
        monkeypatch.setattr(owner, name, replacement)
        response = http.post(path, json=body)
        monkeypatch.undo()
        if answered:  # the fault came after the whole answer was sent
            assert response.status_code == 200, response.text
        elif response.status_code == 200:  # the stream had started: it ends with an error
            assert stream, response.text
            events = [line for line in response.text.splitlines() if line.startswith("data:")]
            last = json.loads(events[-1].removeprefix("data:"))
            assert last["error"]["type"] == "server_error", response.text
        else:
            assert response.status_code == 500, response.text
            assert response.json()["error"]["type"] == "server_error"
        assert eventually(lambda: _everything_returned(gateway)), scrape(gateway)
        # and the key can still use all its slots
        wide = body if path == "/v1/responses" else {**body, "n": 3}  # Responses has no n
        assert http.post(path, json=wide).status_code == 200
    errors = sum(
        count
        for (name, labels), count in scrape(gateway).items()
        if name == "gateway_requests_total" and ("status", "500") in labels
    )
    assert errors == (0 if answered or (stream and step == "relay") else 1)
