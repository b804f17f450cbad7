"""The Prometheus config and rules: promtool checks and tests them, and these tests hold the
rest: every alert and recording rule has a promtool case, every alert a runbook section,
every metric the rules read is listed in monitoring/prometheus/series.py."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from monitoring.prometheus import CONFIG, HERE, RUNBOOK, TESTS_DIR, targets
from monitoring.prometheus.local import stack_targets
from monitoring.prometheus.ruleset import Rule, load_rules, rule_files
from monitoring.prometheus.series import (
    CLUSTER_MADE,
    JOBS,
    PROMETHEUS_MADE,
    REMOVED_VLLM,
    SCRAPED,
)
from monitoring.promql import metric_names
from serving.gateway.usage import CUT_SLACK_TOKENS
from serving.ports import ENGINE_PORT, GATEWAY_METRICS_PORT
from tests.monitoring.promtool import run_promtool

RULES = load_rules()
ALERTS = [rule for rule in RULES if rule.kind == "alert"]
RECORDS = [rule for rule in RULES if rule.kind == "record"]
TEST_FILES = sorted(TESTS_DIR.glob("*.yml"))
MONITORING = HERE.parent

SEVERITIES = {"critical", "warning"}
# level:metric:operations, all three present (Prometheus' naming convention for rules).
RECORD_NAME = re.compile(r"^[a-z][a-z0-9_]*:[a-z][a-z0-9_]*:[a-z][a-z0-9_]*$")
SAMPLE = re.compile(r"^\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?:\{(.*)\})?\s*$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')
UNCHARGED = "stack:gateway_uncharged_tokens:increase10m"


def promtool_tests() -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = []
    for path in TEST_FILES:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        cases.extend(data.get("tests", []))
    return cases


def parse_sample(text: str) -> tuple[str, dict[str, str]]:
    match = SAMPLE.match(text)
    assert match, f"cannot parse series {text!r}"
    return match.group(1), dict(LABEL.findall(match.group(2) or ""))


def github_anchor(heading: str) -> str:
    slug = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return slug.replace(" ", "-")


# promtool itself


def test_promtool_accepts_the_config_and_its_rule_files(promtool: Path) -> None:
    result = run_promtool(promtool, "check", "config", CONFIG)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(rule_files())} rule files found" in result.stdout + result.stderr


def test_promtool_accepts_every_rule_file(promtool: Path) -> None:
    result = run_promtool(promtool, "check", "rules", *rule_files())
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("test_file", TEST_FILES, ids=lambda path: path.name)
def test_promtool_rule_tests_pass(promtool: Path, test_file: Path) -> None:
    result = run_promtool(promtool, "test", "rules", test_file)
    assert result.returncode == 0, result.stdout + result.stderr


# every rule is tested


def test_every_recording_rule_has_an_expected_sample() -> None:
    expected: list[tuple[str, dict[str, str]]] = []
    for case in promtool_tests():
        for check in case.get("promql_expr_test", []):
            expected += [parse_sample(sample["labels"]) for sample in check.get("exp_samples", [])]
    untested = [
        rule.selector
        for rule in RECORDS
        if not any(
            name == rule.name and rule.labels.items() <= labels.items() for name, labels in expected
        )
    ]
    assert not untested, f"recording rules without an exp_samples entry in {TESTS_DIR}: {untested}"


def test_every_alert_has_a_firing_case_and_a_quiet_case() -> None:
    fires: set[str] = set()
    quiet: set[str] = set()
    for case in promtool_tests():
        for check in case.get("alert_rule_test", []):
            (fires if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = {alert.name for alert in ALERTS}
    assert names - fires == set(), f"alerts never shown firing in {TESTS_DIR}"
    assert names - quiet == set(), f"alerts never shown staying quiet in {TESTS_DIR}"
    assert (fires | quiet) - names == set(), "promtool cases for alerts that do not exist"


def test_promtool_tests_load_every_rule_file_they_need() -> None:
    for path in TEST_FILES:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        loaded = {(path.parent / name).resolve() for name in data["rule_files"]}
        assert loaded <= {p.resolve() for p in rule_files()}, f"{path}: unknown rule files"


# alerts are actionable


@pytest.mark.parametrize("alert", ALERTS, ids=lambda rule: rule.name)
def test_alert_has_severity_summary_description_and_runbook(alert: Rule) -> None:
    assert alert.labels.get("severity") in SEVERITIES
    for field in ("summary", "description", "runbook_url"):
        assert alert.annotations.get(field, "").strip(), f"{alert.name}: no {field}"
    assert alert.annotations["runbook_url"] == f"monitoring/RUNBOOK.md#{alert.name.lower()}"


def test_runbook_has_one_section_per_alert() -> None:
    headings = re.findall(r"^## (.+)$", RUNBOOK.read_text(encoding="utf-8"), flags=re.M)
    anchors = [github_anchor(heading) for heading in headings]
    assert len(anchors) == len(set(anchors)), "duplicate runbook sections"
    urls = {alert.annotations["runbook_url"].split("#", 1)[1] for alert in ALERTS}
    assert urls - set(anchors) == set(), "alerts whose runbook_url has no section"
    assert set(anchors) - urls == set(), "runbook sections for alerts that do not exist"


def test_alert_names_are_unique() -> None:
    names = [alert.name for alert in ALERTS]
    assert len(names) == len(set(names))


# names


@pytest.mark.parametrize("record", sorted({rule.name for rule in RECORDS}))
def test_recording_rule_is_named_level_metric_operations(record: str) -> None:
    assert RECORD_NAME.match(record), record


def test_rules_read_exactly_the_listed_series() -> None:
    recorded = {rule.name for rule in RECORDS}
    listed = {series.name for series in SCRAPED}
    used = {name for rule in RULES for name in metric_names(rule.expr)}
    unknown = used - recorded - listed - set(PROMETHEUS_MADE) - set(CLUSTER_MADE)
    assert not unknown, (
        f"rules read series not listed in monitoring/prometheus/series.py: {unknown}"
    )
    assert listed - used == set(), "series.py lists series no rule reads"


def test_every_scraped_series_is_selected_by_its_job() -> None:
    job_of = {series.name: series.job for series in SCRAPED}
    for rule in RULES:
        for name in metric_names(rule.expr):
            if name not in job_of:
                continue
            selectors = re.findall(rf"(?<![\w:]){re.escape(name)}\s*\{{([^}}]*)\}}", rule.expr)
            assert selectors, f"{rule.name}: {name} without a job selector"
            for matchers in selectors:
                assert f'job="{job_of[name]}"' in matchers, f"{rule.name}: {name}{{{matchers}}}"


def test_prometheus_yml_defines_the_jobs_rules_select_on() -> None:
    data = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    assert [job["job_name"] for job in data["scrape_configs"]] == list(JOBS)


def test_prometheus_yml_scrapes_the_stacks_default_ports() -> None:
    """The file spells serving/ports.py's ports (YAML cannot read them): kept equal here."""
    data = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    scraped = {
        job["job_name"]: job["static_configs"][0]["targets"] for job in data["scrape_configs"]
    }
    expected = stack_targets(GATEWAY_METRICS_PORT, ENGINE_PORT, ENGINE_PORT + 1)
    assert scraped == {job: [target] for job, target in expected.items()}


def test_no_file_under_monitoring_uses_a_metric_vllm_removed() -> None:
    own_list = HERE / "series.py"
    for path in sorted(MONITORING.rglob("*")):
        if not path.is_file() or path == own_list or "__pycache__" in path.parts:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # images
        found = [name for name in REMOVED_VLLM if re.search(rf"{re.escape(name)}(?![\w:])", text)]
        assert not found, f"{path} uses metrics vLLM 0.32 no longer exports: {found}"


# the accounting oracle, live


def rule_named(name: str) -> Rule:
    (rule,) = [rule for rule in RULES if rule.name == name]
    return rule


def test_the_uncharged_tokens_rule_allows_each_cut_sequence_the_gateways_slack() -> None:
    """The rules are static YAML, so the slack per cut sequence is a number written there:
    held here to CUT_SLACK_TOKENS (serving/gateway/usage.py), which the gateway's docs, the
    service tier's oracle and the Gateway dashboard read. It is the rule's only number (window
    lengths and label values aside), and it multiplies the cut sequences."""
    expr = rule_named(UNCHARGED).expr
    factors = re.findall(
        r"(\d+(?:\.\d+)?)\s*\*\s*sum\(increase\(gateway_engine_cut_sequences_total\{", expr
    )
    assert factors == [str(CUT_SLACK_TOKENS)]
    bare = re.sub(r"\[[^\]]*\]", " ", re.sub(r"\{[^}]*\}", " ", expr))
    assert re.findall(r"(?<![\w:])\d+(?:\.\d+)?", bare) == [str(CUT_SLACK_TOKENS)]


def test_charges_below_engine_count_fires_on_any_gap_above_zero() -> None:
    """The slack is the only allowance: the alert's threshold is 0, held by its `for` longer
    than the rule's 10-minute window (a single burst leaves the window before it fires)."""
    alert = rule_named("ChargesBelowEngineCount")
    assert alert.expr.split() == [UNCHARGED, ">", "0"]
    assert alert.for_ == "15m"
    assert "[10m]" in rule_named(UNCHARGED).expr


# the generated targets


def test_targets_rules_are_generated_from_the_load_test_targets() -> None:
    assert targets.OUTPUT.read_text(encoding="utf-8") == targets.render(), (
        "monitoring/prometheus/rules/targets.yml is stale: "
        "run .venv/bin/python -m monitoring.prometheus.targets"
    )
    assert targets.OUTPUT in rule_files()


def test_every_profile_target_becomes_a_series() -> None:
    data = yaml.safe_load(targets.render())
    series = {rule["labels"]["profile"]: rule["expr"] for rule in data["groups"][0]["rules"]}
    assert series["cpu-tiny"] == "vector(10)"  # max_ttft_p99_ms: 10000
    assert series["qwen2.5-7b-awq-4090"] == "vector(1.5)"  # max_ttft_p99_ms: 1500
