"""monitoring/snapshot.py without a Prometheus: which panels it draws and how (the live
integration test draws them from real data, through Chromium)."""

from __future__ import annotations

import re

from monitoring.grafana.queries import load_dashboards, panels
from monitoring.prometheus.api import Series
from monitoring.snapshot import MAIN_PANELS, collect, format_value, legend, render_html


class FakePrometheus:
    def __init__(self) -> None:
        self.queries: list[str] = []

    def query(self, expr: str, at: float | None = None) -> list[Series]:
        self.queries.append(expr)
        return [Series({"profile": "cpu-tiny"}, [(at or 0.0, 2.5)])]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[Series]:
        self.queries.append(expr)
        points: list[tuple[float, float | None]] = [(start, 0.5), (start + step, None)]
        points.append((start + 3 * step, 0.25))  # a missing step: the line breaks there
        return [Series({"instance": "127.0.0.1:8001", "status": "200"}, points)]


def test_every_main_panel_is_a_panel_of_its_dashboard() -> None:
    dashboards = load_dashboards()
    for name, titles in MAIN_PANELS.items():
        found = {panel.get("title") for panel in panels(dashboards[name])}
        assert set(titles) <= found, name


def test_legends_and_values_read_like_grafana() -> None:
    assert legend("p50 {{instance}}", {"instance": "a:1"}) == "p50 a:1"
    assert legend(None, {"__name__": "x", "job": "vllm"}) == "job=vllm"
    assert format_value(3 * 2**30, "bytes") == "3.00 GiB"
    assert format_value(0.25, "percentunit") == "25.0%"
    assert format_value(524288, "suffix:tokens") == "524,288 tokens"
    assert format_value(None, "s") == "n/a"


def test_a_page_has_a_chart_per_timeseries_panel_and_a_card_for_the_stats() -> None:
    api = FakePrometheus()
    dashboards = load_dashboards()
    page = collect(api, "capacity.json", dashboards["capacity.json"], 1000.0, 1060.0, 1.0)
    assert [chart.title for chart in page.charts] == [
        "KV cache in use against planned capacity (tokens)", "Sequences against the plan",
        "Load times per start",
    ]  # fmt: skip
    assert [stat.title for stat in page.stats] == list(MAIN_PANELS["capacity.json"][3:])
    unfilled = [q for q in api.queries if re.search(r"\$[A-Za-z_{]", q)]  # ("$1" is PromQL)
    assert not unfilled, unfilled
    first = page.charts[0].lines[0]
    assert first.points[0] == (0.0, 0.5) and (2.0, None) in first.points
    html = render_html(page, "test")
    assert html.count("<svg") == 3 and "Peak memory while loading" in html
    assert "<script" not in html
