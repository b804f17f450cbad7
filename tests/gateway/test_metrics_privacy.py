"""Per-key spend stays off the API port (issue 36): its `/metrics` has the aggregate series
only, whatever the settings; the full render, every key's series, is the metrics port's."""

from __future__ import annotations

import asyncio
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from serving.gateway.app import GatewayApp, create_app
from serving.gateway.metrics import TENANT_LABELS, RequestRecord
from serving.gateway.settings import GatewaySettings
from serving.gateway.types import Message
from tests.gateway.servers import TEST_KEY, closed_port

pytestmark = pytest.mark.timeout(30)

TENANT = "key_tenant42"
ADAPTER = "tenant42-support-lora"

Families = dict[str, list[tuple[str, dict[str, str], float]]]


def busy_app(**settings: object) -> GatewayApp:
    """An app whose metrics hold one tenant's spend, rejections and queue waits, as its
    requests would have left them."""
    app = create_app(
        GatewaySettings.create(
            upstream=f"http://127.0.0.1:{closed_port()}",
            api_keys=[TEST_KEY],
            engine_slots=2,
            **settings,
        )
    )
    started = time.perf_counter()
    served = RequestRecord(started, key=TENANT, model=ADAPTER, status=200)
    served.prompt_tokens, served.completion_tokens = 7, 11
    served.first_byte_at = started + 0.01
    app.metrics.observe(served, started + 0.02)
    refused = RequestRecord(started, key=TENANT, model=ADAPTER, status=429, refusal="tpm")
    app.metrics.observe(refused, started + 0.01)
    assert app.queue is not None
    turn = app.queue.try_turn(TENANT, cost=1)
    assert turn is not None
    app.queue.release(turn, served=1)
    return app


async def get(app: GatewayApp, path: str) -> tuple[int, bytes]:
    """A GET through the ASGI app with no credentials: (status, body)."""
    scope = {
        "type": "http",
        "method": "GET",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [(b"host", b"127.0.0.1:8000")],
    }
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, body


def families(text: str) -> Families:
    return {
        family.name: [(s.name, s.labels, s.value) for s in family.samples]
        for family in text_string_to_metric_families(text)
    }


@pytest.mark.parametrize("metrics_port", [None, 9100], ids=["no-metrics-port", "metrics-port"])
def test_the_api_ports_metrics_name_no_key(metrics_port: int | None) -> None:
    app = busy_app(metrics_port=metrics_port)
    status, body = asyncio.run(get(app, "/metrics"))
    assert status == 200
    text = body.decode()
    assert TENANT not in text and ADAPTER not in text
    for name, samples in families(text).items():
        for sample, labels, _ in samples:
            assert not TENANT_LABELS & labels.keys(), f"{name}: {sample}{labels}"
    found = families(text)
    assert found["gateway_in_flight_requests"][0][2] == 0
    assert found["gateway_queue_running"][0][2] == 0


def test_the_full_render_is_the_aggregate_plus_the_tenant_series() -> None:
    """A family the API port leaves out carries a tenant label; every other one is there
    sample for sample, so a new series is sorted by its labels, not by a list to update."""
    app = busy_app()
    full = families(app.metrics.render().decode())
    aggregate = families(app.metrics.render_aggregate().decode())
    assert any(TENANT in labels.values() for s in full.values() for _, labels, _ in s)
    for name, samples in full.items():
        tenant = any(TENANT_LABELS & labels.keys() for _, labels, _ in samples)
        if tenant:
            assert name not in aggregate, name
        else:
            assert aggregate.get(name) == samples, name
    assert aggregate.keys() <= full.keys()
