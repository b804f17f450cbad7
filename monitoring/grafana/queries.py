"""Read the queries back out of dashboard JSON: for the lint test and the live Prometheus test.

dashboards = load_dashboards()                      # {"engine.json": {...}, ...}
for query in panel_queries(dashboards["engine.json"]):
    query.panel, query.ref, query.expr, metric_names(query.expr)
concrete(query.expr, variable_names(dashboard))     # runnable through Prometheus' API
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from monitoring.grafana.generate import DASHBOARDS_DIR
from monitoring.promql import metric_names, variable_selector

# What Grafana's built-in interval variables stand for when a query runs outside Grafana.
BUILTINS = {"__rate_interval": "1m", "__interval": "15s", "__range": "1h"}


@dataclass(frozen=True)
class PanelQuery:
    panel: str  # the panel's title
    ref: str  # the query's refId
    expr: str


def load_dashboards(directory: Path = DASHBOARDS_DIR) -> dict[str, dict[str, Any]]:
    return {
        path.name: json.loads(path.read_text(encoding="utf-8"))
        for path in sorted(directory.glob("*.json"))
    }


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, rows included, and the panels inside collapsed rows."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def panel_queries(dashboard: dict[str, Any]) -> list[PanelQuery]:
    return [
        PanelQuery(panel.get("title", ""), target.get("refId", ""), target["expr"])
        for panel in panels(dashboard)
        for target in panel.get("targets", [])
    ]


def variables(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = dashboard.get("templating", {}).get("list", [])
    return found


def variable_names(dashboard: dict[str, Any]) -> list[str]:
    return [variable["name"] for variable in variables(dashboard)]


def variable_selectors(dashboard: dict[str, Any]) -> list[str]:
    """The series selectors of the dashboard's `label_values(...)` variables."""
    selectors = []
    for variable in variables(dashboard):
        query = variable.get("query")
        if variable.get("type") == "query" and isinstance(query, str):
            selector = variable_selector(query)
            if selector:
                selectors.append(selector)
    return selectors


def used_metric_names(dashboard: dict[str, Any]) -> set[str]:
    """Every metric name the dashboard's panels and variables read."""
    names: set[str] = set()
    for query in panel_queries(dashboard):
        names |= metric_names(query.expr)
    for selector in variable_selectors(dashboard):
        names |= metric_names(selector)
    return names


def concrete(expr: str, names: Iterable[str], overrides: dict[str, str] | None = None) -> str:
    """`expr` with the dashboard variables `names` as `.*` and Grafana's intervals filled in."""
    values = {name: ".*" for name in names} | BUILTINS | (overrides or {})

    def substitute(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        return values.get(name, match.group(0))

    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", substitute, expr)
