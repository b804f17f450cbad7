"""The monitoring as Kubernetes objects: committed, current, and the same rules and dashboards."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from monitoring.grafana.generate import DASHBOARDS_DIR
from monitoring.kubernetes import (
    DASHBOARDS_FILE,
    GENERATED_DIR,
    HEADER,
    RULE_FILE,
    main,
    render_all,
    stale,
    write_all,
)
from monitoring.prometheus.ruleset import load_rules, rule_files

# kubectl apply keeps the whole object in an annotation, which the API caps at 256 KiB.
LAST_APPLIED_LIMIT = 256 * 1024


def committed(name: str) -> list[dict[str, Any]]:
    text = (GENERATED_DIR / name).read_text(encoding="utf-8")
    return [doc for doc in yaml.safe_load_all(text) if doc]


def test_committed_files_are_the_generators_output(tmp_path: Path) -> None:
    for path in write_all(tmp_path):
        assert path.read_text() == (GENERATED_DIR / path.name).read_text(), (
            f"{GENERATED_DIR / path.name} differs from monitoring/: "
            "run `.venv/bin/python -m monitoring.kubernetes`"
        )
    assert stale(GENERATED_DIR) == []
    assert main(["--check"]) == 0


def test_output_is_deterministic_and_marked_generated() -> None:
    first, second = render_all(), render_all()
    assert first == second
    for text in first.values():
        assert text.startswith(HEADER)


def test_check_names_drifted_files_and_writes_nothing(tmp_path: Path, capsys: Any) -> None:
    write_all(tmp_path)
    (tmp_path / RULE_FILE).write_text("# edited by hand\n")
    (tmp_path / "old.yaml").write_text("{}\n")
    assert stale(tmp_path) == ["old.yaml", RULE_FILE]
    assert main(["--check", "--out", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert RULE_FILE in out and "old.yaml" in out and DASHBOARDS_FILE not in out
    assert (tmp_path / RULE_FILE).read_text() == "# edited by hand\n"


def test_prometheus_rule_holds_every_group_unchanged() -> None:
    [rule] = committed(RULE_FILE)
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["kind"] == "PrometheusRule"
    assert rule["metadata"]["name"] == "qwen-serving"
    assert rule["metadata"]["labels"]["app.kubernetes.io/part-of"] == "qwen-serving"
    groups = []
    for path in rule_files():
        groups.extend(yaml.safe_load(path.read_text(encoding="utf-8"))["groups"])
    assert rule["spec"]["groups"] == groups
    rules = [item for group in groups for item in group["rules"]]
    assert len(rules) == len(load_rules())
    assert {"record", "alert"} <= {key for item in rules for key in item}


def test_every_dashboard_is_a_sidecar_config_map() -> None:
    maps = committed(DASHBOARDS_FILE)
    dashboards = sorted(DASHBOARDS_DIR.glob("*.json"))
    assert dashboards, "no dashboards in monitoring/grafana/dashboards"
    assert [m["metadata"]["name"] for m in maps] == [
        f"grafana-dashboard-{path.stem}" for path in dashboards
    ]
    for config_map, path in zip(maps, dashboards, strict=True):
        assert config_map["apiVersion"] == "v1" and config_map["kind"] == "ConfigMap"
        labels = config_map["metadata"]["labels"]
        assert labels["grafana_dashboard"] == "1"
        assert labels["app.kubernetes.io/part-of"] == "qwen-serving"
        assert config_map["data"] == {path.name: path.read_text(encoding="utf-8")}
        assert json.loads(config_map["data"][path.name])["title"]
        assert len(json.dumps(config_map)) < LAST_APPLIED_LIMIT, path.name
