"""The live monitoring test's harness (tests/integration/test_monitoring_live.py): a second
gateway replica whose engine is unreachable, Debian's Prometheus on the project's scrape config
and rules retargeted at the session's stack, the traffic the dashboards and rules are proven
against, and the check that Prometheus ingested it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml
from openai import OpenAI
from openai.types.chat import ChatCompletionMessageParam
from prometheus_client.parser import text_string_to_metric_families

from monitoring.prometheus.api import PrometheusAPI
from monitoring.prometheus.local import prometheus_argv, render_config, stack_targets
from monitoring.prometheus.series import (
    GATEWAY,
)
from serving.engine.process import terminate
from tests.integration.conftest import (
    MODEL,
    REPO,
    Stack,
    eventually,
    read_tokens,
    serving_env,
)
from tests.integration.test_gateway_quota import client, create_key, idle
from tests.ports import free_port
from tests.services import require

INTERVAL = "1s"
PREFIX = "You answer questions about the weather in short, plain sentences. " * 8
LONG: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Tell me a long story."}]


@dataclass(frozen=True)
class Live:
    api: PrometheusAPI
    start: float
    """Unix time shortly before the traffic began."""
    gateways: tuple[Replica, ...]


@dataclass(frozen=True)
class Replica:
    """A gateway's API URL and its metrics port's, which Prometheus scrapes."""

    url: str
    metrics_url: str


def scrape(url: str) -> dict[str, float]:
    """Sum of each sample name's values in `url`/metrics."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


def wait_until(what: str, check: Callable[[], bool], budget_s: float = 60) -> None:
    try:
        eventually(check, budget_s=budget_s, poll_s=0.5)
    except AssertionError as exc:
        raise AssertionError(f"{what}: {exc}") from None


def host_port(url: str) -> str:
    return url.removeprefix("http://")


# -- the second gateway replica and Prometheus ------------------------------------------------


@contextmanager
def gateway_replica(stack: Stack, workdir: Path) -> Iterator[Replica]:
    """`serving gateway` on the stack's key store whose upstream is a port nothing listens
    on: a replica that lost its engine. Every request through it is an upstream error."""
    port, dead, metrics_port = free_port(), free_port(), free_port()
    log = workdir / "gateway-b.log"
    command = [
        sys.executable, "-m", "serving.cli", "gateway", "--upstream", f"http://127.0.0.1:{dead}",
        "--port", str(port), "--metrics-port", str(metrics_port),
        "--keys-db", str(stack.keys_db), "--drain-delay", "0",
    ]  # fmt: skip
    with log.open("w") as sink:
        process = subprocess.Popen(
            command, env=serving_env(SERVING_API_KEY=stack.api_key), cwd=REPO,
            stdout=sink, stderr=subprocess.STDOUT,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:

        def alive() -> bool:
            assert process.poll() is None, log.read_text()
            try:
                return httpx.get(f"{url}/healthz", timeout=5).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until("the second gateway's /healthz", alive, budget_s=60)
        yield Replica(url, f"http://127.0.0.1:{metrics_port}")
    finally:
        terminate(process, grace_s=30)


def prometheus_config(stack: Stack, gateway_b: Replica) -> str:
    """prometheus.yml retargeted at the stack (make monitor's render_config), plus the second
    gateway as another instance of the gateway job, scraped and evaluated every second."""
    targets = stack_targets(
        int(stack.gateway_metrics_url.rsplit(":", 1)[1]),
        int(stack.engine_url.rsplit(":", 1)[1]),
        int(stack.launcher_url.rsplit(":", 1)[1]),
    )
    data: dict[str, Any] = yaml.safe_load(render_config(targets))
    data["global"] = {
        "scrape_interval": INTERVAL,
        "scrape_timeout": INTERVAL,
        "evaluation_interval": INTERVAL,
    }
    for job in data["scrape_configs"]:
        if job["job_name"] == GATEWAY:
            job["static_configs"][0]["targets"].append(host_port(gateway_b.metrics_url))
    return yaml.safe_dump(data, sort_keys=False)


@contextmanager
def prometheus(config_text: str, workdir: Path) -> Iterator[PrometheusAPI]:
    require("prometheus")
    if shutil.which("prometheus") is None:
        pytest.fail("prometheus not found: `make system-deps` installs Debian's package")
    config = workdir / "prometheus.yml"
    config.write_text(config_text, encoding="utf-8")
    port, log = free_port(), workdir / "prometheus.log"
    with log.open("w") as sink:
        process = subprocess.Popen(
            prometheus_argv(config, workdir / "data", port),
            stdout=sink, stderr=subprocess.STDOUT, cwd=workdir,
        )  # fmt: skip
    api = PrometheusAPI(f"http://127.0.0.1:{port}")
    try:

        def ready() -> bool:
            assert process.poll() is None, log.read_text()[-3000:]
            return api.ready()

        wait_until("Prometheus /-/ready", ready)
        yield api
    finally:
        terminate(process, grace_s=30)


def all_targets_up(api: PrometheusAPI, expected: int) -> bool:
    targets = api.targets()
    return len(targets) == expected and all(t["health"] == "up" for t in targets)


# -- the traffic ----------------------------------------------------------------------------------


def chat(api: OpenAI, index: int, stream: bool) -> None:
    messages: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": PREFIX},
        {"role": "user", "content": f"Question {index}: will it rain tomorrow?"},
    ]
    extra = {"ignore_eos": True}
    if stream:
        chunks = api.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=256, stream=True, extra_body=extra
        )
        assert sum(1 for _ in chunks) > 0
    else:
        reply = api.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=32, extra_body=extra
        )
        assert reply.usage is not None and reply.usage.completion_tokens == 32


def normal_rounds(stack: Stack, sizes: tuple[int, ...], pause_s: float = 2) -> None:
    """Rounds of concurrent chats (half of them streamed), `sizes[i]` at once in round i,
    with a pause between them, so the charts show traffic rising and falling."""
    api = stack.client(max_retries=0)
    with ThreadPoolExecutor(max(sizes)) as pool:
        for round_, size in enumerate(sizes):
            jobs = [pool.submit(chat, api, 10 * round_ + i, i % 2 == 0) for i in range(size)]
            for job in jobs:
                job.result()
            time.sleep(pause_s)


def stored(api: PrometheusAPI, selector: str) -> float:
    """The sum of `selector` in Prometheus now (0 when absent)."""
    found = api.query(f"sum({selector})")
    return (found[0].last or 0.0) if found else 0.0


def twice(api: PrometheusAPI, selector: str, event: Callable[[], None]) -> None:
    """`event` (which adds one to `selector`), Prometheus scraping the count, `event` again:
    a counter's first sample is no increase to rate(), its second one is, so the charts show
    the event (it must only land in some scrape, not in a window)."""
    event()
    wait_until(f"Prometheus sees {selector}", lambda: stored(api, selector) >= 1)
    event()


def quota_rejections(stack: Stack, api: PrometheusAPI) -> None:
    key_id, secret = create_key(stack, "monitoring-rpm", "--rpm", "1")
    keyed = client(stack, secret)
    keyed.chat.completions.create(model=MODEL, messages=LONG, max_tokens=4)

    def rejected() -> None:
        with pytest.raises(openai.RateLimitError) as caught:  # rpm=1: within the minute
            keyed.chat.completions.create(model=MODEL, messages=LONG, max_tokens=4)
        assert caught.value.status_code == 429

    twice(api, f'gateway_quota_rejections_total{{key="{key_id}", reason="rpm"}}', rejected)


def unknown_model(stack: Stack) -> None:
    with pytest.raises(openai.APIStatusError) as caught:
        stack.client(max_retries=0).chat.completions.create(
            model="no-such-model", messages=LONG, max_tokens=4
        )
    assert 400 <= caught.value.status_code < 500


def upstream_errors(stack: Stack, gateway_b: Replica, api: PrometheusAPI) -> None:
    """Gateway B cannot reach its engine: 503, counted as an upstream `connect` error."""
    payload = {"model": MODEL, "messages": LONG, "max_tokens": 8}

    def unreachable() -> None:
        response = httpx.post(
            f"{gateway_b.url}/v1/chat/completions", json=payload, timeout=60,
            headers={"Authorization": f"Bearer {stack.api_key}"},
        )  # fmt: skip
        assert response.status_code == 503, response.text

    twice(api, 'gateway_upstream_errors_total{kind="connect"}', unreachable)


def disconnect_mid_stream(stack: Stack) -> None:
    stream = stack.client().chat.completions.create(
        model=MODEL, messages=LONG, max_tokens=1800, stream=True, extra_body={"ignore_eos": True}
    )
    assert read_tokens(stream) == 3
    stream.close()


def drive_traffic(stack: Stack, gateway_b: Replica, api: PrometheusAPI) -> None:
    normal_rounds(stack, (2, 4, 8, 4))
    quota_rejections(stack, api)
    unknown_model(stack)
    upstream_errors(stack, gateway_b, api)
    disconnect_mid_stream(stack)
    wait_until("the stack idle after the disconnect", lambda: idle(stack))
    normal_rounds(stack, (8, 4, 2))
    wait_until("the stack idle after the traffic", lambda: idle(stack))


def ingested(api: PrometheusAPI, stack: Stack, gateways: tuple[Replica, ...]) -> bool:
    """Prometheus holds the counters as the stack shows them now (after the traffic)."""
    per_instance = {
        series.labels.get("instance"): series.last
        for series in api.query("sum by (instance) (gateway_requests_total)")
    }
    for gateway in gateways:
        shown = scrape(gateway.metrics_url)["gateway_requests_total"]
        if per_instance.get(host_port(gateway.metrics_url)) != shown:
            return False
    stored = api.query("sum(vllm:generation_tokens_total)")
    return (
        bool(stored) and stored[0].last == scrape(stack.engine_url)["vllm:generation_tokens_total"]
    )
