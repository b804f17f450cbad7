"""Metered requests end to end over real sockets: admit, rewrite, relay, settle exactly once.

docs/architecture.md, reliability cases 3, 7, 8, 9, 10 and 18 (every test ends with the gateway
idle: no request in flight, no lease held), plus what the upstream receives and what is charged.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import httpx
import pytest

from serving.gateway.keys import SqliteKeyStore
from serving.gateway.keys.record import KeySpec
from serving.gateway.openai_request import parse_completion_request
from serving.gateway.quota import Limits
from tests.gateway.conftest import GatewayFactory
from tests.gateway.fake_upstream import FakeUpstream
from tests.gateway.scrape import key_usage, scrape, settled, value
from tests.gateway.servers import TEST_KEY, GatewayServer, http_client
from tests.gateway.test_proxy_streaming import sse_events

pytestmark = pytest.mark.timeout(30)

MESSAGES = [{"role": "user", "content": "hi"}]
ESTIMATE = parse_completion_request(
    "chat", json.dumps({"model": "m", "messages": MESSAGES}).encode()
).prompt_estimate
LIMITS = Limits(rpm=100, tpm=100_000, max_tokens=50)


def body(model: str = "fake", **fields: Any) -> dict[str, Any]:
    return {"model": model, "messages": MESSAGES, **fields}


def post(gateway: GatewayServer, secret: str, payload: Any, token: str = "-") -> httpx.Response:
    with http_client(gateway.url, key=secret) as http:
        return http.post(f"/v1/chat/completions?t={token}", json=payload)


@pytest.fixture
def keyed(make_gateway: GatewayFactory, keys: SqliteKeyStore) -> GatewayServer:
    return make_gateway(keys_db=str(keys.path), upstream_idle_timeout_s=0.5)


def new_key(keys: SqliteKeyStore, limits: Limits = LIMITS, **options: Any) -> tuple[str, str]:
    record, secret = keys.create(KeySpec("test", limits=limits, **options))
    return record.key_id, secret


# -- rewriting and settling ------------------------------------------------------------


def test_stream_gets_usage_upstream_but_not_downstream_and_is_charged_as_reported(
    keyed: GatewayServer, keys: SqliteKeyStore, upstream: FakeUpstream, token: str
) -> None:
    key_id, secret = new_key(keys, Limits(tpm=10_000, max_tokens=3))
    response = post(keyed, secret, body(stream=True), token)
    events = sse_events(response.content)
    assert response.status_code == 200
    assert events[-1] == "[DONE]"
    assert all("usage" not in json.loads(event) for event in events[:-1])
    [sent] = upstream.received(token)
    assert sent["max_tokens"] == 3  # capped by the key
    assert sent["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert settled(keyed)
    # Charged what the fake reported: 3 prompt + 3 completion (max_tokens=3 words).
    assert key_usage(keyed, key_id) == (0, 1, 6, 6)
    samples = scrape(keyed)
    assert value(samples, "gateway_tokens_total", key=key_id, model="fake", kind="prompt") == 3
    assert value(samples, "gateway_tokens_total", key=key_id, model="fake", kind="completion") == 3


@pytest.mark.parametrize("path", ["/v1/chat/completions/", "/v1/completions/"])
def test_a_trailing_slash_is_metered_and_sent_to_the_canonical_path(
    keyed: GatewayServer, keys: SqliteKeyStore, upstream: FakeUpstream, token: str, path: str
) -> None:
    """vLLM serves these through a redirect to its own address; the gateway meters them and
    forwards to the path vLLM serves, so nothing goes around the quota or leaks the engine."""
    key_id, secret = new_key(keys, Limits(rpm=100))  # a restricted key: metered paths only
    payload = body(max_tokens=10) if "chat" in path else {"model": "fake", "prompt": "hi"}
    with http_client(keyed.url, key=secret) as http:
        response = http.post(f"{path}?t={token}", json=payload)
    assert response.status_code == 200
    assert "location" not in response.headers
    assert len(upstream.received(token)) == 1  # the fake serves only the canonical paths
    assert settled(keyed)
    assert key_usage(keyed, key_id)[1] == 1  # one request counted


def test_usage_kept_for_a_client_that_asked(keyed: GatewayServer, keys: SqliteKeyStore) -> None:
    _, secret = new_key(keys)
    payload = body(stream=True, stream_options={"include_usage": True})
    events = sse_events(post(keyed, secret, payload).content)
    usage = [json.loads(event)["usage"] for event in events[:-1] if "usage" in event]
    assert usage == [{"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}]
    assert settled(keyed)


def test_json_response_is_charged_as_reported(
    keyed: GatewayServer, keys: SqliteKeyStore, upstream: FakeUpstream, token: str
) -> None:
    key_id, secret = new_key(keys)
    response = post(keyed, secret, body(max_tokens=10), token)
    assert response.json()["usage"]["total_tokens"] == 5
    assert upstream.received(token)[0]["max_tokens"] == 10
    assert settled(keyed)
    assert key_usage(keyed, key_id) == (0, 1, 5, 5)


def test_missing_max_tokens_uses_key_cap_or_context_window(
    keyed: GatewayServer, keys: SqliteKeyStore, upstream: FakeUpstream, token: str
) -> None:
    _, capped = new_key(keys, Limits(max_tokens=7))
    _, uncapped = new_key(keys, Limits(rpm=1000))
    post(keyed, capped, body(), token)
    post(keyed, uncapped, body(), token)
    capped_sent, uncapped_sent = upstream.received(token)
    assert capped_sent["max_tokens"] == 7
    # The fake serves "fake" with max_model_len 2048: what the prompt leaves of it.
    assert uncapped_sent["max_tokens"] == 2048 - ESTIMATE


def test_max_tokens_beyond_the_context_is_400_before_quota(
    keyed: GatewayServer, keys: SqliteKeyStore, upstream: FakeUpstream, token: str
) -> None:
    key_id, secret = new_key(keys, Limits(rpm=5))
    response = post(keyed, secret, body(max_tokens=10**9), token)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "max_tokens"
    assert not upstream.received(token)
    assert key_usage(keyed, key_id) == (0, 0, 0, 0)


def test_huge_max_tokens_is_capped_by_the_key_first(
    keyed: GatewayServer, keys: SqliteKeyStore, upstream: FakeUpstream, token: str
) -> None:
    _, secret = new_key(keys, Limits(max_tokens=7))
    assert post(keyed, secret, body(max_tokens=10**9), token).status_code == 200
    assert upstream.received(token)[0]["max_tokens"] == 7


def test_n_choices_reserve_max_tokens_each(keyed: GatewayServer, keys: SqliteKeyStore) -> None:
    _, secret = new_key(keys, Limits(tpm=ESTIMATE + 150))
    assert post(keyed, secret, body(max_tokens=100)).status_code == 200
    refused = post(keyed, secret, body(max_tokens=100, n=2))
    assert refused.status_code == 429
    assert refused.json()["error"]["type"] == "tokens"
    assert settled(keyed)


# -- refusals consume nothing (case 3) ---------------------------------------------------


def test_refused_for_concurrency_consumes_no_rpm_or_tpm(
    keyed: GatewayServer, keys: SqliteKeyStore, upstream: FakeUpstream, token: str
) -> None:
    key_id, secret = new_key(keys, Limits(rpm=10, tpm=10_000, max_concurrency=1, max_tokens=20))
    holder = threading.Thread(target=post, args=(keyed, secret, body("gated"), token))
    holder.start()
    assert upstream.wait_for(f"{token}:started", 5)
    before = key_usage(keyed, key_id)
    assert before == (1, 1, ESTIMATE + 20, ESTIMATE + 20)
    refused = post(keyed, secret, body())
    assert refused.status_code == 429
    error = refused.json()["error"]
    assert (error["type"], error["code"]) == ("requests", "rate_limit_exceeded")
    assert refused.headers["retry-after"] == "1"
    assert key_usage(keyed, key_id) == before
    upstream.release(token)
    holder.join(5)
    assert settled(keyed)
    assert value(scrape(keyed), "gateway_quota_rejections_total", key=key_id, reason="concurrency")


BAD_TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}]


def test_a_schema_refused_after_admission_consumes_nothing(
    keyed: GatewayServer, keys: SqliteKeyStore, upstream: FakeUpstream, token: str
) -> None:
    """Schemas are checked after the reservation (they cost the event loop); a body they
    refuse is withdrawn: its 400 leaves requests/min, tokens and the slot as they were."""
    key_id, secret = new_key(keys, Limits(rpm=1, tpm=10_000, max_concurrency=1))
    for _ in range(3):
        refused = post(keyed, secret, body(tools=BAD_TOOLS), token)
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["param"] == "tools[0].function.parameters"
        assert key_usage(keyed, key_id) == (0, 0, 0, 0)
    assert not upstream.received(token)
    assert post(keyed, secret, body(), token).status_code == 200  # its one request a minute
    assert settled(keyed)


def test_a_key_at_its_limit_is_refused_before_its_schemas_are_checked(
    keyed: GatewayServer, keys: SqliteKeyStore
) -> None:
    """Cheap checks first: a key that spent its requests/min gets its 429 without the
    gateway compiling the schemas it sent."""
    _, secret = new_key(keys, Limits(rpm=1))
    assert post(keyed, secret, body()).status_code == 200
    refused = post(keyed, secret, body(tools=BAD_TOOLS))
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["type"] == "requests"
    assert settled(keyed)


def test_model_not_allowed_is_404_and_consumes_nothing(
    keyed: GatewayServer, keys: SqliteKeyStore
) -> None:
    key_id, secret = new_key(keys, Limits(rpm=10), models=["other-model"])
    response = post(keyed, secret, body())
    assert response.status_code == 404
    error = response.json()["error"]
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error",
        "model_not_found",
        "model",
    )
    assert key_usage(keyed, key_id) == (0, 0, 0, 0)


def test_every_key_meets_the_same_route_table(keyed: GatewayServer, keys: SqliteKeyStore) -> None:
    # A key without limits used to reach every vLLM route: the table is the same for all.
    _, limited = new_key(keys, Limits(rpm=10))
    _, unlimited = new_key(keys)
    for secret in (limited, unlimited, TEST_KEY):
        with http_client(keyed.url, key=secret) as http:
            refused = http.post("/v1/chat/completions/batch", json={})
            assert refused.status_code == 403, refused.text
            assert refused.json()["error"]["code"] == "endpoint_not_allowed"
            assert http.post("/v1/load_lora_adapter", json={}).status_code == 403
            assert http.post("/v1/nothing", json={}).status_code == 404
            models = http.get("/v1/models")
            assert models.status_code == 200
    assert models.headers.get("x-ratelimit-limit-requests") != "10"
    with http_client(keyed.url, key=limited) as http:
        models = http.get("/v1/models")
    assert models.headers["x-ratelimit-limit-requests"] == "10"


# -- every response carries the headers ------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "status"),
    [
        (body(), 200),
        (body(stream=True), 200),
        (body(max_tokens=-1), 400),
        (body("fault-context"), 400),
        (body("fault-500"), 502),
        (body(max_tokens=40, n=40), 429),
    ],
)
def test_every_response_carries_request_id_and_rate_limit_headers(
    keyed: GatewayServer, keys: SqliteKeyStore, payload: Any, status: int
) -> None:
    _, secret = new_key(keys, Limits(rpm=10, tpm=1000))
    response = post(keyed, secret, payload)
    assert response.status_code == status
    assert response.headers["x-request-id"]
    for kind, limit in (("requests", "10"), ("tokens", "1000")):
        assert response.headers[f"x-ratelimit-limit-{kind}"] == limit
        assert int(response.headers[f"x-ratelimit-remaining-{kind}"]) >= 0
        assert response.headers[f"x-ratelimit-reset-{kind}"].endswith("s")
    assert settled(keyed)


# -- upstream failures (cases 7, 8, 9, 10, 14) -------------------------------------------


def charged(gateway: GatewayServer, key_id: str) -> int:
    assert settled(gateway)
    in_flight, _, tokens, today = key_usage(gateway, key_id)
    assert in_flight == 0 and tokens == today
    return tokens


def upstream_errors(gateway: GatewayServer, kind: str) -> float:
    return value(scrape(gateway), "gateway_upstream_errors_total", kind=kind)


def test_upstream_killed_mid_stream_gives_error_event_and_charges_relayed_tokens(
    keyed: GatewayServer, keys: SqliteKeyStore
) -> None:
    key_id, secret = new_key(keys)
    events = sse_events(post(keyed, secret, body("fault-reset", stream=True)).content)
    assert "[DONE]" not in events
    assert json.loads(events[-1])["error"]["code"] == "upstream_error"
    assert len(events) == 3
    assert charged(keyed, key_id) == ESTIMATE + 2  # two token events relayed
    assert upstream_errors(keyed, "reset") == 1


def test_in_band_error_passes_through_and_is_recorded(
    keyed: GatewayServer, keys: SqliteKeyStore
) -> None:
    key_id, secret = new_key(keys)
    events = sse_events(post(keyed, secret, body("fault-in-band", stream=True)).content)
    assert json.loads(events[-2])["error"]["message"] == "engine died"
    assert events[-1] == "[DONE]"
    assert ESTIMATE + 2 <= charged(keyed, key_id) <= ESTIMATE + 4
    assert upstream_errors(keyed, "in_band") == 1


@pytest.mark.parametrize(
    ("stream", "model", "kind"),
    [
        (True, "fault-garbage", "bad_sse"),
        (False, "fault-garbage", "bad_json"),
        (True, "fault-no-usage", "missing_usage"),
        (False, "fault-no-usage", "missing_usage"),
    ],
)
def test_garbage_or_missing_usage_is_counted_and_charged_at_the_reservation(
    keyed: GatewayServer, keys: SqliteKeyStore, stream: bool, model: str, kind: str
) -> None:
    key_id, secret = new_key(keys)
    response = post(keyed, secret, body(model, stream=stream, max_tokens=9))
    assert response.status_code == 200
    assert charged(keyed, key_id) == ESTIMATE + 9
    assert upstream_errors(keyed, kind) == 1


def test_idle_upstream_mid_stream_is_a_timeout_event_and_frees_the_slot(
    keyed: GatewayServer, keys: SqliteKeyStore
) -> None:
    key_id, secret = new_key(keys, Limits(max_concurrency=1))
    events = sse_events(post(keyed, secret, body("fault-hang-mid-stream", stream=True)).content)
    assert json.loads(events[-1])["error"]["type"] == "timeout"
    assert charged(keyed, key_id) == ESTIMATE + 1
    assert upstream_errors(keyed, "timeout") == 1
    assert post(keyed, secret, body()).status_code == 200  # the slot is free again


def test_idle_upstream_before_headers_is_504_and_charges_what_it_could_have_made(
    keyed: GatewayServer, keys: SqliteKeyStore
) -> None:
    # The engine had the request until the gateway gave up: it may have generated all of
    # max_tokens, so the timeout is charged as an abort (the reservation), not refunded.
    key_id, secret = new_key(keys)
    payload = body("fault-hang", max_tokens=25, n=2)
    response = post(keyed, secret, payload)
    assert response.status_code == 504
    assert response.json()["error"]["type"] == "timeout"
    parsed = parse_completion_request("chat", json.dumps(payload).encode())
    assert charged(keyed, key_id) == parsed.prompt_estimate + 2 * 25


def test_upstream_400_passes_through_and_charges_no_tokens(
    keyed: GatewayServer, keys: SqliteKeyStore
) -> None:
    key_id, secret = new_key(keys)
    response = post(keyed, secret, body("fault-context"))
    assert response.status_code == 400
    assert "maximum context length" in response.json()["error"]["message"]
    assert charged(keyed, key_id) == 0
    assert key_usage(keyed, key_id)[1] == 1  # the request itself counts against rpm


# -- the client goes away ----------------------------------------------------------------


def test_an_aborted_stream_with_n_choices_is_charged_its_prompt_not_its_other_choices(
    keyed: GatewayServer, keys: SqliteKeyStore, upstream: FakeUpstream, token: str
) -> None:
    # n choices reserve (n - 1) x max_tokens beside the prompt; an abort once charged that
    # part as prompt tokens. It is charged the prompt and the events relayed, as for n = 1.
    key_id, secret = new_key(keys)
    payload = body("gated", stream=True, n=3, max_tokens=50)
    with (
        http_client(keyed.url, key=secret) as http,
        http.stream("POST", f"/v1/chat/completions?t={token}", json=payload) as response,
    ):
        next(response.iter_raw())
    assert upstream.wait_for(f"{token}:cancelled", 2)
    assert charged(keyed, key_id) == ESTIMATE + 1
    samples = scrape(keyed)
    prompt = value(samples, "gateway_tokens_total", key=key_id, model="other", kind="prompt")
    assert prompt == ESTIMATE


def test_client_disconnect_mid_stream_charges_what_was_relayed(
    keyed: GatewayServer, keys: SqliteKeyStore, upstream: FakeUpstream, token: str
) -> None:
    key_id, secret = new_key(keys)
    with (
        http_client(keyed.url, key=secret) as http,
        http.stream("POST", f"/v1/chat/completions?t={token}", json=body("gated", stream=True))
        as response,
    ):  # fmt: skip
        next(response.iter_raw())
    assert upstream.wait_for(f"{token}:cancelled", 2)
    assert charged(keyed, key_id) == ESTIMATE + 1
    # "gated" is not in the upstream's model list: its label is "other" (bounded labels).
    samples = scrape(keyed)
    assert value(samples, "gateway_requests_total", key=key_id, model="other", status="200") == 1
