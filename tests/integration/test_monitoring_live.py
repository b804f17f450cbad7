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

Fairness, live: the fairness index (job:gateway_tokens:jain_index_rate5m, and the Gateway
dashboard's panel drawing it) exists only while two keys have had requests waiting in the fair
queue for all of its 5-minute window, which the traffic above never makes and a 5-minute flood
would outlast the test for: those queries are left out of the checks that every query returns
series, and a test of their own floods the gateway from two keys at once and evaluates the
same expression over a 20-second window (jain_index()'s one parameter): both keys counted,
served alike.

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
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from monitoring.grafana.fairness import backlogged_keys, jain_index
from monitoring.grafana.gateway import FAIRNESS_PANEL
from monitoring.grafana.queries import (
    concrete,
    load_dashboards,
    panel_queries,
    used_metric_names,
    variable_names,
    variable_selectors,
)
from monitoring.prometheus.api import PrometheusAPI
from monitoring.prometheus.ruleset import Rule, load_rules
from monitoring.prometheus.series import (
    CLUSTER_MADE,
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
)
from tests.integration.monitoring_stack import (
    LONG,
    Live,
    Replica,
    all_targets_up,
    drive_traffic,
    gateway_replica,
    ingested,
    prometheus,
    prometheus_config,
    wait_until,
)
from tests.integration.test_fair_sharing import flood
from tests.integration.test_gateway_quota import create_key, idle

pytestmark = [pytest.mark.prometheus, pytest.mark.browser]

DOCS = REPO / "docs" / "monitoring"
UNCHARGED = "stack:gateway_uncharged_tokens:increase10m"
CHARGES_ALERT = "ChargesBelowEngineCount"
# Needs two keys backlogged for all of its 5m window: proven over FAIR_WINDOW by its own test.
FAIRNESS_INDEX = "job:gateway_tokens:jain_index_rate5m"
FAIR_WINDOW = "20s"
FAIR_STREAMS = 24  # per key: 1.5x the engine's 16 sequences, so each key always has some waiting


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
            if query.panel != FAIRNESS_PANEL:  # test_the_fairness_index_...
                queries[f"{name} / {query.panel} / {query.ref}"] = concrete(query.expr, names)
        for selector in variable_selectors(dashboard):
            queries[f"{name} / variable {selector}"] = concrete(selector, names)
    assert len(queries) > 40
    returns_series(live.api, queries)


def test_every_recording_rule_returns_series(live: Live) -> None:
    queries: dict[str, str] = {}
    for rule in load_rules():
        if rule.kind == "record" and rule.name != FAIRNESS_INDEX:
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
    never_recorded = sorted(recorded - live.api.names() - {FAIRNESS_INDEX})
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


# Fairness, live: after the charges were checked on the ordinary traffic (the flood's cut
# streams are not that traffic), before a charge is withheld (last: the gap stays up).


def test_the_fairness_index_sees_two_backlogged_keys_served_alike(live: Live, stack: Stack) -> None:
    """Two keys flood the gateway at once, each with more streams than the engine runs, so
    both have requests waiting at every scrape while the fair queue serves them in turn. The
    fairness index (the recording rule's and the dashboard panel's expression over a 20 s
    window) then counts exactly those two keys and reads near 1: 0.9 is two keys served 2:1."""
    (id_a, secret_a), (id_b, secret_b) = create_key(stack, "fair-a"), create_key(stack, "fair-b")
    index = jain_index(FAIR_WINDOW)
    with (
        flood(stack.gateway_url, secret_a, FAIR_STREAMS),
        flood(stack.gateway_url, secret_b, FAIR_STREAMS),
    ):
        wait_until(
            "the index of two backlogged keys", lambda: bool(live.api.query(index)), budget_s=120
        )
        found = live.api.query(index)
        counted = {series.labels["key"] for series in live.api.query(backlogged_keys(FAIR_WINDOW))}
    wait_until("the stack idle after the flood", lambda: idle(stack), budget_s=120)
    # the next test reads the accounting gap: from settled counters, not the flood's last ones
    wait_until("Prometheus ingested the flood", lambda: ingested(live.api, stack, live.gateways))
    assert counted == {id_a, id_b}
    assert len(found) == 1 and (found[0].last or 0.0) >= 0.9, found


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
    with stack.off_the_books():  # the test's own oracle leaves them out; Prometheus does not
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
