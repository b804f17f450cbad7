"""Scale-out, the healthy half: `serving up --replicas 2` routing over its two engines, and
requests, concurrency and tokens per minute holding across gateway replicas that share Redis
(the topology: conftest.py)."""

from __future__ import annotations

import pytest
from openai import OpenAI

from serving.engine.process import http_ok
from serving.gateway.images import ImagePolicy
from serving.gateway.openai_request import chat_prompt_estimate
from tests.integration.conftest import MODEL, eventually, scrape, total
from tests.integration.scale_out import (
    SHORT,
    SseStream,
    Topology,
    burst,
    long_stream,
    quota_usage,
)

pytestmark = pytest.mark.timeout(900)


# -- serving up --replicas 2 --------------------------------------------------------------


def vllm_finished(engine_url: str) -> float:
    """Requests vLLM itself counts as finished (its own /metrics)."""
    return total(scrape(engine_url), "vllm:request_success_total")


def test_serving_up_runs_two_engines_and_its_gateway_routes_over_both(topology: Topology) -> None:
    up = topology.up
    assert "2 vLLM engines (the gateway routes over them)" in up.stack.output.read_text()
    for url, launcher in zip(up.engine_urls, up.launcher_ports, strict=True):
        served = OpenAI(base_url=f"{url}/v1", api_key="unused").models.list()
        assert [model.id for model in served.data] == [MODEL]
        assert http_ok(f"http://127.0.0.1:{launcher}/metrics")
    gateway = up.gateway
    before = [vllm_finished(url) for url in up.engine_urls]
    labels = [gateway.engine(0), gateway.engine(1)]
    routed = [gateway.value("gateway_engine_requests_total", engine=e) for e in labels]
    client = up.stack.client(max_retries=0)
    for _ in range(6):
        reply = client.chat.completions.create(
            model=MODEL, messages=SHORT["messages"], max_tokens=4
        )
        assert reply.choices[0].message.content is not None
    sent = [
        gateway.value("gateway_engine_requests_total", engine=e) - routed[i]
        for i, e in enumerate(labels)
    ]
    assert sent[0] >= 1 and sent[1] >= 1 and sum(sent) == 6
    # What the gateway says it sent each engine is what each engine says it served (vLLM
    # counts a request once its last output is processed, maybe after the reply left).
    eventually(
        lambda: (
            [vllm_finished(url) - was for url, was in zip(up.engine_urls, before, strict=True)]
            == sent
        )
    )


# -- limits across replicas (case 2; case 1 and tokens/min likewise) ------------------------


def test_requests_per_minute_hold_across_three_replicas(topology: Topology) -> None:
    def check() -> None:
        key_id, secret = topology.key("rpm-across", "--rpm", "6")
        assert burst(topology.replicas, secret, 6, SHORT) == {200: 6, 429: 12}
        assert topology.rejections(key_id, "rpm") == 12
        assert quota_usage(topology.redis.url, key_id).requests_in_window == 6
        topology.settled(key_id)

    topology.while_redis_answers(check)


# Frozen engines (SIGSTOP) see a client's disconnect only when thawed and generate on until
# then, past what the gateways read: the oracle leaves the freezing tests out.
@pytest.mark.oracle_exempt
def test_max_concurrency_holds_across_replicas_and_slots_come_back(topology: Topology) -> None:
    def check() -> None:
        key_id, secret = topology.key("concurrency-across", "--max-concurrency", "3")
        url = topology.redis.url
        # A stream on each replica, held (engines frozen) while two more arrive on each.
        with topology.engines() as engines:
            engines.freeze()
            streams = [SseStream(r.url, secret, long_stream()).start() for r in topology.replicas]
            eventually(lambda: quota_usage(url, key_id).in_flight == 3)
            assert burst(topology.replicas, secret, 2, SHORT) == {429: 6}
            assert topology.rejections(key_id, "concurrency") == 6
            assert quota_usage(url, key_id).in_flight == 3
        for stream in streams:  # admitted streams, streaming once the engines run
            stream.wait_events(3)
            stream.stop()
        # The slots come back, to every replica (another's ending may take milliseconds).
        eventually(lambda: quota_usage(url, key_id).in_flight == 0)
        assert burst(topology.replicas, secret, 1, SHORT) == {200: 3}
        topology.settled(key_id)
        topology.back_in_rotation()

    topology.while_redis_answers(check)


@pytest.mark.oracle_exempt  # freezes the engines (above)
def test_tokens_per_minute_hold_across_replicas(topology: Topology) -> None:
    body = long_stream()
    # A request books its prompt's estimate plus max_tokens: room for three, not four.
    reservation = chat_prompt_estimate(body, ImagePolicy.defaults()) + body["max_tokens"]
    tpm = 3 * reservation + reservation // 2

    def check() -> None:
        key_id, secret = topology.key("tpm-across", "--tpm", str(tpm))
        url = topology.redis.url
        with topology.engines() as engines:
            engines.freeze()
            streams = [SseStream(r.url, secret, body).start() for r in topology.replicas]
            eventually(lambda: quota_usage(url, key_id).in_flight == 3)
            assert burst(topology.replicas, secret, 2, body) == {429: 6}
            assert topology.rejections(key_id, "tpm") == 6
            assert quota_usage(url, key_id).tokens_in_window == 3 * reservation
        for stream in streams:
            stream.wait_events(3)
            stream.stop()
        # Closed, each is charged what it produced instead of its reservation, once: the
        # minute holds what the replicas charged, and has room again.
        topology.settled(key_id)
        charged = sum(replica.charged(key_id) for replica in topology.replicas)
        assert quota_usage(url, key_id).tokens_in_window == charged
        assert burst(topology.replicas, secret, 1, SHORT) == {200: 3}
        topology.settled(key_id)
        topology.back_in_rotation()

    topology.while_redis_answers(check)
