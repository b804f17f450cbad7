"""Tenants on one base model, end to end on the real engine (cpu-tiny-lora's, `lora_engine`,
shared with test_lora.py) behind a `serving gateway` process set up as `serving up` sets it up
for that profile, plus the admin API: the adapter's answers differ from the base model's, keys
bound to the adapter, per-adapter limits, runtime adapters through `serving adapters`, priority
classes, and the usage report per key and adapter equal to the counters and to vLLM's own
usage."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from serving.models.tiny_lora import ANSWER, BASE_MODEL, default_adapter_dir
from tests.integration.conftest import (
    REPO,
    TEST_KEY,
    Stack,
    eventually,
    scrape,
    serving_env,
)
from tests.integration.scale_out import start_gateway, wait_up
from tests.integration.test_gateway_quota import create_key

pytestmark = pytest.mark.engine

ADMIN = "adm-tenants-test"
BASE, ADAPTER, RUNTIME = BASE_MODEL, "team-a", "team-b"
HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Hello, who are you?"}]


@pytest.fixture(scope="module")
def lora_stack(lora_engine: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    directory = tmp_path_factory.mktemp("tenants")
    keys_db = directory / "keys.db"
    gateway = start_gateway(
        "tenants", [lora_engine], directory,
        "--keys-db", str(keys_db), "--api-key", TEST_KEY, "--admin-key", ADMIN,
        "--runtime-adapters", "true", "--engine-priority", "true", "--drain-delay", "0",
    )  # fmt: skip
    try:
        wait_up(gateway)
        yield Stack(
            gateway.url, lora_engine, TEST_KEY, gateway.process, gateway.log, keys_db, "",
            gateway.metrics_url,
        )  # fmt: skip
    finally:
        gateway.terminate()  # drains, then exits with SIGTERM's status (uvicorn re-raises it)


def _client(stack: Stack, secret: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.gateway_url}/v1", api_key=secret, max_retries=0)


def _answer(stack: Stack, secret: str, model: str) -> str:
    reply = _client(stack, secret).chat.completions.create(
        model=model,
        messages=HELLO,
        max_tokens=12,
        temperature=0,
    )
    return reply.choices[0].message.content or ""


def test_the_adapter_answers_as_built_and_the_base_model_does_not(lora_stack: Stack) -> None:
    assert _answer(lora_stack, lora_stack.api_key, ADAPTER).startswith(ANSWER)
    assert not _answer(lora_stack, lora_stack.api_key, BASE).startswith(ANSWER)
    models = _client(lora_stack, lora_stack.api_key).models.list()
    assert sorted(model.id for model in models.data) == [BASE, ADAPTER]


def test_a_key_bound_to_the_adapter_gets_it_and_never_the_base_model(lora_stack: Stack) -> None:
    _, bound = create_key(lora_stack, "team-a", "--models", ADAPTER, "--default-adapter", ADAPTER)
    _, only = create_key(lora_stack, "team-a-strict", "--models", ADAPTER)
    # the base model's name, answered by the key's fine-tune
    assert _answer(lora_stack, bound, BASE).startswith(ANSWER)
    assert [model.id for model in _client(lora_stack, bound).models.list().data] == [ADAPTER]
    with pytest.raises(openai.NotFoundError) as refused:
        _answer(lora_stack, only, BASE)
    assert refused.value.code == "model_not_found"
    assert _answer(lora_stack, only, ADAPTER).startswith(ANSWER)


def test_per_adapter_limits_hold(lora_stack: Stack) -> None:
    _, secret = create_key(lora_stack, "limited", "--model-limit", f"{ADAPTER}:rpm=1")
    _answer(lora_stack, secret, ADAPTER)
    with pytest.raises(openai.RateLimitError):
        _answer(lora_stack, secret, ADAPTER)
    _answer(lora_stack, secret, BASE)  # the base model's own budget is untouched


def _adapters(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "serving.cli", "adapters", *argv],
        env=serving_env(SERVING_ADMIN_KEY=ADMIN), cwd=REPO, capture_output=True, text=True,
    )  # fmt: skip


def test_runtime_adapters_load_and_unload_on_the_engine(lora_stack: Stack) -> None:
    where = ("--gateway", lora_stack.gateway_url)
    with pytest.raises(openai.NotFoundError):  # vLLM's own answer: it has no such model
        _answer(lora_stack, lora_stack.api_key, RUNTIME)
    loaded = _adapters(*where, "load", RUNTIME, str(default_adapter_dir()))
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.startswith(f"{RUNTIME}  loaded") and "engines: none" not in loaded.stdout
    assert _answer(lora_stack, lora_stack.api_key, RUNTIME).startswith(ANSWER)
    listed = httpx.get(f"{lora_stack.engine_url}/v1/models").json()["data"]
    assert RUNTIME in [entry["id"] for entry in listed]  # on the engine itself
    unloaded = _adapters(*where, "unload", RUNTIME)
    assert unloaded.returncode == 0, unloaded.stderr
    listed = httpx.get(f"{lora_stack.engine_url}/v1/models").json()["data"]
    assert RUNTIME not in [entry["id"] for entry in listed]
    with pytest.raises(openai.NotFoundError):
        _answer(lora_stack, lora_stack.api_key, RUNTIME)


def _engine_tokens(stack: Stack) -> float:
    samples = scrape(stack.engine_url)
    names = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total")
    return sum(value for (name, _), value in samples.items() if name in names)


def test_the_usage_report_equals_the_counters_and_vllms_usage(lora_stack: Stack) -> None:
    key_a, secret_a = create_key(lora_stack, "report-a", "--models", ADAPTER)
    key_b, secret_b = create_key(lora_stack, "report-b")
    before = _engine_tokens(lora_stack)
    reported: dict[tuple[str, str], int] = {}
    for key_id, secret, model in (
        (key_a, secret_a, ADAPTER),
        (key_b, secret_b, ADAPTER),
        (key_b, secret_b, BASE),
    ):
        for stream in (False, True):
            client = _client(lora_stack, secret)
            if stream:
                chunks = client.chat.completions.create(
                    model=model, messages=HELLO, max_tokens=8, stream=True,
                    stream_options={"include_usage": True},
                )  # fmt: skip
                usage = [chunk.usage for chunk in chunks if chunk.usage][-1]
            else:
                reply = client.chat.completions.create(model=model, messages=HELLO, max_tokens=8)
                assert reply.usage is not None
                usage = reply.usage
            got = reported.get((key_id, model), 0)
            reported[(key_id, model)] = got + usage.prompt_tokens + usage.completion_tokens
    engine_delta = _engine_tokens(lora_stack) - before
    assert engine_delta == sum(reported.values())  # traffic without aborts: vLLM counted it all

    today = datetime.now(UTC).strftime("%Y-%m-%d")
    url = f"{lora_stack.gateway_url}/admin/v1/usage?from={today}&to={today}"

    def report_matches() -> bool:
        answer = httpx.get(url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30)
        assert answer.status_code == 200, answer.text
        per = {
            (key["key_id"], model["model"]): model["prompt_tokens"] + model["completion_tokens"]
            for key in answer.json()["keys"]
            if key["key_id"] in (key_a, key_b)
            for model in key["models"]
        }
        return per == reported

    eventually(report_matches, budget_s=30)
    counters = scrape(lora_stack.gateway_metrics_url)
    for (key_id, model), tokens in reported.items():
        counted = sum(
            value
            for (name, labels), value in counters.items()
            if name == "gateway_tokens_total" and {("key", key_id), ("model", model)} <= labels
        )
        assert counted == tokens, (key_id, model)
    tenant = httpx.get(url, headers={"Authorization": f"Bearer {secret_b}"}, timeout=30)
    assert tenant.status_code == 401  # a tenant key never reads the report


def test_a_keys_priority_class_reaches_vllms_priority_queue(lora_stack: Stack) -> None:
    # cpu-tiny-lora runs vLLM with priority scheduling and the gateway has engine_priority on
    # (`serving up` sets it for such a profile, tests/test_stack.py): vLLM takes the key's
    # class (the body the gateway sends is held in tests/gateway/test_engine_priority.py); a
    # client's own is refused.
    _, urgent = create_key(lora_stack, "urgent", "--priority", "-5")
    assert _answer(lora_stack, urgent, ADAPTER).startswith(ANSWER)
    with pytest.raises(openai.BadRequestError) as refused:
        _client(lora_stack, urgent).chat.completions.create(
            model=BASE, messages=HELLO, max_tokens=4, extra_body={"priority": -100}
        )
    assert refused.value.param == "priority"
