"""Monitoring, proven live (issue 9 item 5): a real Prometheus scrapes the real stack.

Debian's `prometheus` runs on monitoring/prometheus/prometheus.yml (retargeted by
monitoring.prometheus.local at the session's stack, every second) with the project's rule
files; it scrapes the gateways' metrics ports, the only ones with the per-key series (their API
ports' /metrics, which any client reads, name no key: checked here too). Traffic goes through
the gateway: chat completions streamed and not (with a shared prefix, so the prefix cache
hits), a quota rejection (a key with rpm=1 asked twice), a model the engine does not serve
(404), a client that disconnects mid-stream, and upstream errors: a second gateway replica (the
same keys) whose engine is unreachable answers 503
(gateway_upstream_errors_total{kind="connect"}, gateway_upstream_healthy 0 for it; the tiny
model writes 1900 tokens in under a second, so an idle timeout is no reliable error).

Once Prometheus holds the counters as they stand after the traffic, every dashboard panel
query, every dashboard variable's selector and every recording rule (its expression and the
series it records) must return series through /api/v1/query, and every metric name used under
monitoring/ must be in the scrape. The main panels are drawn to PNG (monitoring/snapshot.py):
into docs/monitoring/ with SERVING_WRITE_DOCS=1 (docs/monitoring.md's pictures), else into the
test's tmp dir.

The accounting oracle, live (issue 36): after that traffic the gap between vLLM's token
counters and the gateways' charges (stack:gateway_uncharged_tokens:increase10m, as the real
Prometheus evaluates it) is at most 0 and ChargesBelowEngineCount's expression selects
nothing; then, last, a charge is withheld on purpose (requests straight to vLLM's port, which
vLLM counts and nobody charges) and the expression goes above 0, the alert pending.

Waits are on conditions with generous budgets (a loaded 2-core machine sometimes
schedules nothing for seconds), never on a scrape landing inside a window.
"""

from __future__ import annotations

import os
import shutil
import signal
import struct
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

from monitoring.grafana.queries import (
    concrete,
    load_dashboards,
    panel_queries,
    used_metric_names,
    variable_names,
    variable_selectors,
)
from monitoring.prometheus.api import PrometheusAPI
from monitoring.prometheus.local import prometheus_argv, render_config, stack_targets
from monitoring.prometheus.ruleset import Rule, load_rules
from monitoring.prometheus.series import (
    CLUSTER_MADE,
    GATEWAY,
    JOBS,
    PROMETHEUS_MADE,
    scraped_names,
)
from monitoring.promql import metric_names
from monitoring.snapshot import MAIN_PANELS, write_snapshots
from tests.integration.conftest import (
    MODEL,
    REPO,
    Stack,
    eventually,
    read_tokens,
    serving_env,
)
from tests.integration.oracle import read_ledger
from tests.integration.test_gateway_quota import client, create_key, idle
from tests.ports import free_port
from tests.services import require

pytestmark = [pytest.mark.prometheus, pytest.mark.browser]

INTERVAL = "1s"
DOCS = REPO / "docs" / "monitoring"
PREFIX = "You answer questions about the weather in short, plain sentences. " * 8
LONG: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Tell me a long story."}]
UNCHARGED = "stack:gateway_uncharged_tokens:increase10m"
CHARGES_ALERT = "ChargesBelowEngineCount"


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
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


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
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


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


@pytest.fixture(scope="module")
def live(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    workdir = tmp_path_factory.mktemp("prometheus")
    with (
        gateway_replica(stack, workdir) as gateway_b,
        prometheus(prometheus_config(stack, gateway_b), workdir) as api,
    ):
        wait_until("every target up", lambda: all_targets_up(api, len(JOBS) + 1))
        start = time.time()
        time.sleep(3)  # a baseline before the traffic, for the pictures
        drive_traffic(stack, gateway_b, api)
        gateways = (Replica(stack.gateway_url, stack.gateway_metrics_url), gateway_b)
        wait_until("Prometheus ingested the traffic", lambda: ingested(api, stack, gateways))
        yield Live(api, start, gateways)


# -- the checks ---------------------------------------------------------------------------


def returns_series(api: PrometheusAPI, queries: dict[str, str], budget_s: float = 60) -> None:
    """Every query returns at least one series, waiting (on the condition) for rule
    evaluations and rate windows to catch up; fails naming the ones that never did."""
    empty = dict(queries)
    spent = 0.0
    while True:
        empty = {name: expr for name, expr in empty.items() if not api.query(expr)}
        if not empty or spent >= budget_s:
            break
        before = time.monotonic()
        time.sleep(1)
        spent += min(time.monotonic() - before, 2.0)  # host stalls are not charged
    listing = "\n".join(f"  {name}: {expr}" for name, expr in empty.items())
    assert not empty, f"{len(empty)} of {len(queries)} queries returned no series:\n{listing}"


def test_only_the_metrics_ports_name_keys(live: Live) -> None:
    """The per-key series Prometheus stores came from the metrics ports; the API ports'
    /metrics, which any client reads without a key, name no key and no model."""
    for gateway in live.gateways:
        private = httpx.get(f"{gateway.metrics_url}/metrics", timeout=10)
        public = httpx.get(f"{gateway.url}/metrics", timeout=10)
        assert private.status_code == 200 and 'key="' in private.text
        assert public.status_code == 200 and "gateway_in_flight_requests" in public.text
        assert 'key="' not in public.text and 'model="' not in public.text


def test_every_dashboard_panel_query_returns_series(live: Live) -> None:
    queries: dict[str, str] = {}
    for name, dashboard in load_dashboards().items():
        names = variable_names(dashboard)
        for query in panel_queries(dashboard):
            queries[f"{name} / {query.panel} / {query.ref}"] = concrete(query.expr, names)
        for selector in variable_selectors(dashboard):
            queries[f"{name} / variable {selector}"] = concrete(selector, names)
    assert len(queries) > 40
    returns_series(live.api, queries)


def test_every_recording_rule_returns_series(live: Live) -> None:
    queries: dict[str, str] = {}
    for rule in load_rules():
        if rule.kind == "record":
            where = f"{rule.file.name} / {rule.selector}"
            queries[f"{where} (expr)"] = rule.expr
            queries[f"{where} (recorded)"] = rule.selector
    assert len(queries) > 40
    returns_series(live.api, queries)


def test_every_metric_name_under_monitoring_is_in_the_scrape(live: Live) -> None:
    rules = load_rules()
    recorded = {rule.name for rule in rules if rule.kind == "record"}
    used = scraped_names() | set(PROMETHEUS_MADE)
    for rule in rules:
        used |= metric_names(rule.expr)
    for dashboard in load_dashboards().values():
        used |= used_metric_names(dashboard)
    jobs = "|".join(JOBS)
    # Series of the scrape jobs: what the targets exported (and Prometheus' `up`), plus the
    # rules' own series, which keep the job label; a name no rule records came from a scrape.
    in_jobs = {
        series.labels["__name__"]
        for series in live.api.query(f'group by (__name__) ({{job=~"{jobs}"}})')
    }
    # kube-state-metrics' series exist only in a Kubernetes cluster (k8s/), not here.
    missing = sorted(name for name in used - recorded - set(CLUSTER_MADE) if name not in in_jobs)
    assert not missing, f"used under monitoring/ but not in the live scrape: {missing}"
    never_recorded = sorted(recorded - live.api.names())
    assert not never_recorded, f"recording rules that wrote nothing: {never_recorded}"


def test_the_main_panels_render_to_png(live: Live, tmp_path: Path) -> None:
    write_docs = os.environ.get("SERVING_WRITE_DOCS") == "1"
    out = DOCS if write_docs else tmp_path
    note = "recorded by tests/integration/test_monitoring_live.py on the embedded cpu-tiny stack"
    written = write_snapshots(live.api, out, live.start, time.time(), step=1.0, note=note)
    assert [path.name for path in written] == [
        name.replace(".json", ".png") for name in MAIN_PANELS
    ]
    for path in written:
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n", path
        width, height = struct.unpack(">II", data[16:24])
        assert width > 1000 and height > 600, (path, width, height)
        html = path.with_suffix(".html").read_text(encoding="utf-8")
        assert "no data" not in html, f"{path}: a main panel had no data"
        assert html.count("<svg") >= 3 and html.count('class="series"') >= 3
    if write_docs:
        for path in written:
            path.with_suffix(".html").unlink()  # docs/monitoring.md shows the PNGs only


# -- the accounting oracle, live ------------------------------------------------------------


def rule(name: str) -> Rule:
    (found,) = [rule for rule in load_rules() if rule.name == name]
    return found


def uncharged(api: PrometheusAPI) -> float:
    """The gap (vLLM's count less the charges and the slack, over 10m), its recording rule's
    expression evaluated by Prometheus now."""
    found = api.query(rule(UNCHARGED).expr)
    assert len(found) == 1, found
    value = found[0].last
    assert value is not None, found
    return value


def alert_states(api: PrometheusAPI, name: str) -> set[str]:
    """pending/firing, as Prometheus' own rule evaluation holds the alert now."""
    return {series.labels["alertstate"] for series in api.query(f'ALERTS{{alertname="{name}"}}')}


def test_charges_cover_vllms_count_after_the_traffic(live: Live) -> None:
    """ChargesBelowEngineCount stays silent on ordinary traffic: after the streams, the cut
    one, the prefix cache hits and the replica whose engine is gone, the gap is at most 0 (in
    the rule's expression and in the series it records), the alert's expression selects
    nothing, and the alert is not pending (the accounting fixture checks the same traffic
    against vLLM's counters directly)."""
    assert uncharged(live.api) <= 0
    assert live.api.query(rule(CHARGES_ALERT).expr) == []

    def recorded_and_quiet() -> bool:
        recorded = live.api.query(UNCHARGED)
        settled = len(recorded) == 1 and (recorded[0].last or 0.0) <= 0
        return settled and not alert_states(live.api, CHARGES_ALERT)

    wait_until("the recorded gap at most 0, the alert inactive", recorded_and_quiet, budget_s=30)


@pytest.mark.engine_direct
def test_charges_below_engine_count_fires_when_a_charge_is_withheld(
    live: Live, stack: Stack
) -> None:
    """A charge withheld on purpose: chat completions sent straight to vLLM's port, around the
    gateway. vLLM counts their tokens and no key pays, so once Prometheus scrapes them the gap
    goes above 0, the alert's expression selects it and the alert is pending (it would fire
    after its 15 minutes, which the promtool cases show). Enough tokens to outweigh what the
    traffic before overpaid (prompts from the prefix cache), with a margin; the tiny model
    writes them in seconds. Last in the module: the gap stays up for 10 minutes."""
    before = uncharged(live.api)
    needed = max(0.0, -before) * 1.1 + 500
    direct = stack.direct_client()
    sent = 0
    while sent < needed:
        reply = direct.chat.completions.create(
            model=MODEL, messages=LONG, max_tokens=1500, extra_body={"ignore_eos": True}
        )
        assert reply.usage is not None
        sent += reply.usage.completion_tokens
    wait_until("the gap above 0", lambda: uncharged(live.api) > 0)

    def selected() -> bool:
        """The alert's expression reads the recorded gap: a rule evaluation later."""
        fired = live.api.query(rule(CHARGES_ALERT).expr)
        return len(fired) == 1 and (fired[0].last or 0.0) > 0

    wait_until("the alert's expression selecting the gap", selected)
    wait_until("the alert pending", lambda: bool(alert_states(live.api, CHARGES_ALERT)))
    assert alert_states(live.api, CHARGES_ALERT) == {"pending"}
    # vLLM's counters settled before the next test's accounting check reads them
    read_ledger(stack.gateway_url, stack.engine_url)
