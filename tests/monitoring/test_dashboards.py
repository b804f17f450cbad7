"""The Grafana dashboards: current with their code, well-formed, reading only exported series."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from monitoring.exported import exported_names, vllm_names
from monitoring.grafana.common import DATASOURCE_VARIABLE
from monitoring.grafana.fairness import FAIR_SKEWED, FAIR_WINDOW, jain_index
from monitoring.grafana.gateway import ACCOUNTING_PANEL, FAIRNESS_PANEL
from monitoring.grafana.generate import BUILDERS, DASHBOARDS_DIR, stale, write_all
from monitoring.grafana.plans import shipped_plans
from monitoring.grafana.queries import (
    concrete,
    load_dashboards,
    panel_queries,
    panels,
    used_metric_names,
    variable_names,
    variables,
)
from monitoring.prometheus.ruleset import load_rules
from monitoring.promql import metric_names, variable_selector
from serving.cli import main as serving_main
from serving.profiles import Profile, load_all_profiles
from tests.services import require

PROVISIONING = DASHBOARDS_DIR.parent / "provisioning"
DASHBOARDS = load_dashboards()
DATASOURCE_UID = "${" + DATASOURCE_VARIABLE + "}"


def test_every_dashboard_is_committed_and_current(tmp_path: Path) -> None:
    assert sorted(DASHBOARDS) == sorted(BUILDERS)
    for path in write_all(tmp_path):
        committed = DASHBOARDS_DIR / path.name
        assert path.read_text() == committed.read_text(), (
            f"{committed} differs from the code: run `.venv/bin/python -m monitoring.grafana`"
        )
    assert stale(DASHBOARDS_DIR) == []


def test_stale_names_a_changed_file(tmp_path: Path) -> None:
    write_all(tmp_path)
    (tmp_path / "engine.json").write_text("{}\n")
    (tmp_path / "old.json").write_text("{}\n")
    assert stale(tmp_path) == ["engine.json", "old.json"]


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_panel_ids_are_unique(name: str) -> None:
    ids = [panel.get("id") for panel in panels(DASHBOARDS[name])]
    assert all(isinstance(panel_id, int) and panel_id > 0 for panel_id in ids), ids
    assert len(ids) == len(set(ids)), ids


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_a_prometheus_datasource_variable_that_every_query_uses(name: str) -> None:
    dashboard = DASHBOARDS[name]
    declared = [v for v in variables(dashboard) if v["name"] == DATASOURCE_VARIABLE]
    assert len(declared) == 1
    assert declared[0]["type"] == "datasource"
    assert declared[0]["query"] == "prometheus"
    for panel in panels(dashboard):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": DATASOURCE_UID}, panel["title"]
        assert panel["targets"], f"{panel['title']}: no query"
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == DATASOURCE_UID, panel["title"]
    for variable in variables(dashboard):
        if variable["type"] == "query":
            assert variable["datasource"]["uid"] == DATASOURCE_UID, variable["name"]


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_every_panel_has_a_unit_and_distinct_query_ids(name: str) -> None:
    for panel in panels(DASHBOARDS[name]):
        if panel["type"] == "row":
            continue
        assert panel["fieldConfig"]["defaults"].get("unit"), f"{panel['title']}: no unit"
        refs = [target["refId"] for target in panel["targets"]]
        assert all(refs) and len(refs) == len(set(refs)), f"{panel['title']}: refIds {refs}"


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_every_query_reads_a_metric_and_only_known_variables(name: str) -> None:
    dashboard = DASHBOARDS[name]
    known = set(variable_names(dashboard))
    for query in panel_queries(dashboard):
        assert metric_names(query.expr), f"{query.panel} {query.ref}: reads no metric"
        for variable in re.findall(r"\$\{?([A-Za-z_]\w*)", query.expr):
            assert variable in known or variable.startswith("__"), f"{query.panel}: ${variable}"
        assert "$" not in concrete(query.expr, known).replace('"$1"', ""), query.expr


def test_the_vllm_source_reading_finds_the_known_series() -> None:
    names = vllm_names()
    assert {"vllm:num_requests_running", "vllm:prompt_tokens_total"} <= names
    assert "vllm:time_to_first_token_seconds_bucket" in names
    assert "vllm:gpu_cache_usage_perc" not in names  # removed before 0.32


def test_every_metric_name_is_exported_by_this_stack() -> None:
    exported = exported_names()
    for name, dashboard in DASHBOARDS.items():
        unknown = used_metric_names(dashboard) - exported
        assert not unknown, f"{name} reads series nothing here exports: {sorted(unknown)}"


def test_the_dashboards_cover_what_issue_9_asks_for() -> None:
    used = {name: used_metric_names(dashboard) for name, dashboard in DASHBOARDS.items()}
    assert {
        "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
        "vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket",
        "vllm:e2e_request_latency_seconds_bucket", "vllm:num_requests_running",
        "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "vllm:num_preemptions_total",
        "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total",
    } <= used["engine.json"]  # fmt: skip
    assert {
        "gateway_requests_total", "gateway_added_latency_seconds_bucket",
        "gateway_quota_rejections_total", "gateway_tokens_total", "gateway_upstream_healthy",
        "gateway_in_flight_requests", "gateway_upstream_errors_total",
    } <= used["gateway.json"]  # fmt: skip
    assert {
        "vllm:cache_config_info", "vllm:kv_cache_usage_perc", "serving_engine_model_load_seconds",
        "serving_engine_load_peak_memory_bytes", "serving_engine_startup_seconds",
    } <= used["capacity.json"]  # fmt: skip


def test_the_gateway_dashboard_charts_the_gap_its_alert_reads() -> None:
    """The Accounting panel draws vLLM's count, the charges, the cut streams' slack and the gap
    that ChargesBelowEngineCount fires on: the recording rule's expression, to the character
    (bar white space), so the chart and the alert cannot drift apart."""
    (rule,) = [r for r in load_rules() if r.name == "stack:gateway_uncharged_tokens:increase10m"]
    queries = [q for q in panel_queries(DASHBOARDS["gateway.json"]) if q.panel == ACCOUNTING_PANEL]
    assert len(queries) == 4
    squashed = ["".join(query.expr.split()) for query in queries]
    assert "".join(rule.expr.split()) in squashed
    names = set().union(*(metric_names(query.expr) for query in queries))
    assert names == {
        "vllm:generation_tokens_total", "vllm:prompt_tokens_by_source_total",
        "gateway_engine_accounted_tokens_total", "gateway_engine_cut_sequences_total",
    }  # fmt: skip


def test_the_gateway_dashboard_charts_the_fairness_index_its_alert_reads() -> None:
    """The fairness panel draws the recording rule job:gateway_tokens:jain_index_rate5m's
    expression to the character (bar white space), with FairShareSkewed's threshold as its
    line; the window is jain_index()'s one parameter (the live test shortens it)."""
    rules = {rule.name: rule for rule in load_rules()}
    index = rules["job:gateway_tokens:jain_index_rate5m"]
    queries = [q for q in panel_queries(DASHBOARDS["gateway.json"]) if q.panel == FAIRNESS_PANEL]
    assert ["".join(q.expr.split()) for q in queries] == ["".join(index.expr.split())]
    assert rules["FairShareSkewed"].expr.split() == [index.name, "<", str(FAIR_SKEWED)]
    assert jain_index() == jain_index(FAIR_WINDOW) == index.expr.strip()
    assert FAIR_WINDOW not in jain_index("20s")
    assert jain_index("20s") == jain_index().replace(FAIR_WINDOW, "20s")


@pytest.mark.parametrize(
    "profile", [p for p in load_all_profiles() if not p.model.startswith("builtin:")], ids=str
)
def test_planned_constants_are_what_serving_plan_prints(
    profile: Profile, capsys: pytest.CaptureFixture[str]
) -> None:
    serving_main(["plan", "--profile", profile.name, "--json"])
    printed = json.loads(capsys.readouterr().out)
    plan = next(plan for plan in shipped_plans() if plan.profile == profile.name)
    assert plan.kv_capacity_tokens == printed["kv"]["capacity_tokens"]
    assert plan.kv_blocks == printed["kv"]["num_blocks"]
    assert plan.max_sequences == printed["max_sequences_at_full_context"]


def test_capacity_charts_the_plan_of_every_shipped_profile() -> None:
    text = (DASHBOARDS_DIR / "capacity.json").read_text()
    for plan in shipped_plans():
        constant = (
            f'label_replace(vector({plan.kv_capacity_tokens}), \\"profile\\", \\"{plan.profile}\\"'
        )
        assert constant in text, plan.profile


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        (
            "histogram_quantile(0.99, sum by (le, instance) (rate(vllm:e2e_request_latency_seconds"
            '_bucket{instance=~"$instance"}[$__rate_interval])))',
            {"vllm:e2e_request_latency_seconds_bucket"},
        ),
        (
            "sum(rate(a_total[5m])) by (job) / ignoring(x) group_left(y) b offset 5m",
            {"a_total", "b"},
        ),
        (
            'label_replace(vector(1), "profile", "p", "", "") and on (profile) c{profile=~"$p"}',
            {"c"},
        ),
        ('{__name__="named"} > 1e-3 and bar unless baz[5m:1m] @ start()', {"named", "bar", "baz"}),
        ("max(x) > bool 0 or Inf", {"x"}),
        ("level:metric:rate5m", {"level:metric:rate5m"}),
        ("(sum(rate(m_total[1m])) or vector(0)) / sum(rate(n_total[1m]))", {"m_total", "n_total"}),
    ],
)
def test_metric_names(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_variable_selector_and_concrete() -> None:
    assert variable_selector('label_values(gateway_requests_total{a="b"}, key)') == (
        'gateway_requests_total{a="b"}'
    )
    assert variable_selector("label_values(key)") is None
    expr = 'rate(x{i=~"$instance", k=~"${key}"}[$__rate_interval]) / label_replace(y, "a", "$1")'
    assert concrete(expr, ["instance", "key"]) == (
        'rate(x{i=~".*", k=~".*"}[1m]) / label_replace(y, "a", "$1")'
    )


def _promtool(*args: str) -> None:
    require("prometheus")
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: `make system-deps` installs Debian's prometheus"
    done = subprocess.run([promtool, *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def _concrete_queries(name: str) -> dict[tuple[str, str], str]:
    dashboard = DASHBOARDS[name]
    names = variable_names(dashboard)
    overrides = {"__rate_interval": "5m"}  # four samples of the 1m test series below
    return {(q.panel, q.ref): concrete(q.expr, names, overrides) for q in panel_queries(dashboard)}


@pytest.mark.prometheus
def test_every_query_is_valid_promql(tmp_path: Path) -> None:
    rules = [
        {"record": f"dashboard:query_{index}:check", "expr": expr}
        for index, expr in enumerate(
            expr for name in sorted(DASHBOARDS) for expr in _concrete_queries(name).values()
        )
    ]
    path = tmp_path / "queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    _promtool("check", "rules", str(path))


@pytest.mark.prometheus
def test_capacity_and_error_ratio_queries_on_synthetic_series(tmp_path: Path) -> None:
    """The plan joins the running profile and the replica's model; no 5xx reads as 0."""
    capacity = _concrete_queries("capacity.json")
    gateway = _concrete_queries("gateway.json")
    replica = '{job="vllm", instance="h:8001", model_name="qwen3-tiny", engine="0"}'
    case = {
        "interval": "1m",
        "input_series": [
            {
                "series": 'serving_engine_startup_seconds{job="engine-launcher", '
                'instance="h:8002", profile="cpu-tiny", model="qwen3-tiny"}',
                "values": "30x10",
            },
            {"series": f"vllm:kv_cache_usage_perc{replica}", "values": "0.25x10"},
            {
                "series": 'gateway_requests_total{instance="h:8000", key="k1", model="m", '
                'status="200"}',
                "values": "0+6x10",
            },
        ],
        "promql_expr_test": [
            {
                "expr": capacity[("Planned KV capacity", "A")],
                "eval_time": "5m",
                "exp_samples": [
                    {"labels": '{profile="cpu-tiny", model="qwen3-tiny"}', "value": 524288}
                ],
            },
            {
                "expr": capacity[("KV cache in use against planned capacity", "A")],
                "eval_time": "5m",
                "exp_samples": [{"labels": replica, "value": 131072}],
            },
            {
                "expr": gateway[("5xx ratio", "A")],
                "eval_time": "5m",
                "exp_samples": [{"labels": "{}", "value": 0}],
            },
        ],
    }
    path = tmp_path / "queries_test.yml"
    path.write_text(yaml.safe_dump({"rule_files": [], "tests": [case]}))
    _promtool("test", "rules", str(path))


def _expand(value: str, env: dict[str, str]) -> str:
    """Grafana's provisioning expansion (Go's os.ExpandEnv): $VAR or ${VAR}, unset is empty."""
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: env.get(m.group(1) or m.group(2), ""), value)


def test_provisioning_points_grafana_at_prometheus_and_the_dashboards() -> None:
    env = {
        "SERVING_PROMETHEUS_URL": "http://127.0.0.1:9090",
        "SERVING_GRAFANA_DASHBOARDS": str(DASHBOARDS_DIR),
    }
    datasources = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yml").read_text())
    [datasource] = datasources["datasources"]
    assert datasource["type"] == "prometheus" and datasource["isDefault"] is True
    assert _expand(datasource["url"], env) == "http://127.0.0.1:9090"
    providers = yaml.safe_load((PROVISIONING / "dashboards" / "serving.yml").read_text())
    [provider] = providers["providers"]
    assert provider["type"] == "file"
    path = Path(_expand(provider["options"]["path"], env))
    assert sorted(p.name for p in path.glob("*.json")) == sorted(BUILDERS)
