"""PNG snapshots of each dashboard's main panels, drawn from a live Prometheus.

    python -m monitoring.snapshot --prometheus http://127.0.0.1:9090 --out DIR [--minutes 15]

For each dashboard in monitoring/grafana/dashboards, the panels named in MAIN_PANELS are
queried over the range (their own PromQL, variables as `.*`, `$__rate_interval` as
RATE_INTERVAL) and drawn as an HTML page of inline SVG line charts (loadtest/svg.py) plus one
card for the stat panels; headless Chromium turns the page into DIR/<dashboard>.png. No
Grafana needed: docs/monitoring.md shows what the dashboards look like from the
live integration test's Prometheus (tests/integration/test_monitoring_live.py writes them
to docs/monitoring/ when SERVING_WRITE_DOCS=1).
"""

from __future__ import annotations

import argparse
import html
import math
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from loadtest.svg import COLORS, Line, line_chart
from monitoring.grafana.queries import concrete, load_dashboards, panels, variable_names
from monitoring.prometheus import PROMETHEUS_PORT
from monitoring.prometheus.api import PrometheusAPI, Series

# The panels each picture shows, by dashboard file and panel title (timeseries are charted,
# stat panels are listed together in one card with their latest value).
MAIN_PANELS: dict[str, tuple[str, ...]] = {
    "engine.json": (
        "Tokens per second", "Running and waiting requests", "Time to first token",
        "End-to-end request latency", "KV cache usage", "Prefix cache hit rate",
    ),
    "gateway.json": (
        "Requests per second by status", "Tokens per second by key",
        "Added latency (the gateway's own time)", "Time to first byte",
        "Quota rejections per second by reason", "Upstream errors per second by kind",
    ),
    "capacity.json": (
        "KV cache in use against planned capacity", "Sequences against the plan",
        "Load times per start", "Planned KV capacity", "Model load time", "Start to healthy",
        "Peak memory while loading", "Engine restarts",
    ),
}  # fmt: skip
# Grafana's $__rate_interval for a short range scraped every second or so.
RATE_INTERVAL = "10s"

CHART_W, CHART_H, LEGEND_H, GAP, PAD, HEADER_H = 640, 240, 52, 16, 16, 64
CARD_W, CARD_H = CHART_W + 16, CHART_H + LEGEND_H + 8
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
)  # fmt: skip


class Queries(Protocol):
    """What is read from Prometheus (PrometheusAPI; a fake in the unit tests)."""

    def query(self, expr: str, at: float | None = None) -> list[Series]: ...
    def query_range(self, expr: str, start: float, end: float, step: float) -> list[Series]: ...


@dataclass(frozen=True)
class Chart:
    title: str
    lines: list[Line]
    y_unit: str = ""


@dataclass(frozen=True)
class Stat:
    title: str
    values: list[tuple[str, str]]  # (legend, formatted value)


@dataclass(frozen=True)
class Page:
    dashboard: str  # the dashboard's title
    name: str  # the file stem: engine, gateway, capacity
    charts: list[Chart]
    stats: list[Stat]


def legend(template: str | None, labels: dict[str, str]) -> str:
    """Grafana's legendFormat filled in (`{{instance}}`); the labels when there is none."""
    if not template or template == "__auto":
        shown = {k: v for k, v in labels.items() if k != "__name__"}
        return ", ".join(f"{k}={v}" for k, v in sorted(shown.items())) or "value"
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), template).strip()


def _unit(panel: dict[str, Any]) -> str:
    unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit")
    return str(unit) if unit else ""


def _title_unit(unit: str) -> tuple[str, float, str]:
    """(suffix for the title, scale for values, suffix for the axis ticks)."""
    if unit == "percentunit":
        return "", 100.0, "%"
    if unit == "s":
        return "", 1.0, "s"
    if unit.startswith("suffix:"):
        return f" ({unit.removeprefix('suffix:').strip()})", 1.0, ""
    return {"reqps": " (req/s)", "cps": " (per second)"}.get(unit, ""), 1.0, ""


def format_value(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    if unit == "bytes":
        for size, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
            if abs(value) >= size:
                return f"{value / size:.2f} {name}"
        return f"{value:.0f} B"
    if unit == "s":
        return f"{value:.1f} s"
    if unit == "percentunit":
        return f"{100 * value:.1f}%"
    suffix = f" {unit.removeprefix('suffix:').strip()}" if unit.startswith("suffix:") else ""
    text = f"{value:,.0f}" if value == math.floor(value) else f"{value:,.3g}"
    return text + suffix


def collect(
    api: Queries, name: str, dashboard: dict[str, Any], start: float, end: float, step: float
) -> Page:
    """The main panels of `dashboard` (MAIN_PANELS[name]) queried over [start, end]."""
    names = variable_names(dashboard)
    overrides = {"__rate_interval": RATE_INTERVAL, "__range": f"{max(1, int(end - start))}s"}
    by_title = {panel.get("title"): panel for panel in panels(dashboard)}
    charts: list[Chart] = []
    stats: list[Stat] = []
    for title in MAIN_PANELS[name]:
        panel = by_title.get(title)
        if panel is None:
            raise KeyError(f"{name} has no panel titled {title!r} (monitoring/snapshot.py)")
        unit = _unit(panel)
        targets = panel.get("targets", [])
        if panel.get("type") == "stat":
            values: list[tuple[str, str]] = []
            for target in targets:
                for series in api.query(concrete(target["expr"], names, overrides), at=end):
                    text = legend(target.get("legendFormat"), series.labels)
                    values.append((text, format_value(series.last, unit)))
            stats.append(Stat(title, values))
            continue
        title_suffix, scale, y_unit = _title_unit(unit)
        lines: list[Line] = []
        for target in targets:
            expr = concrete(target["expr"], names, overrides)
            for series in api.query_range(expr, start, end, step):
                points = [
                    (t - start, None if v is None else v * scale) for t, v in _gapped(series, step)
                ]
                lines.append(Line(legend(target.get("legendFormat"), series.labels), points))
        charts.append(Chart(title + title_suffix, lines, y_unit))
    return Page(str(dashboard.get("title", name)), name.removesuffix(".json"), charts, stats)


def _gapped(series: Series, step: float) -> list[tuple[float, float | None]]:
    """The series' points with a None wherever a step is missing, so lines break there."""
    out: list[tuple[float, float | None]] = []
    previous: float | None = None
    for t, value in series.points:
        if previous is not None and t - previous > 1.5 * step:
            out.append((previous + step, None))
        out.append((t, value))
        previous = t
    return out


def _legend_html(lines: Sequence[Line]) -> str:
    items = [
        f'<span class="item"><span class="swatch" style="background:{COLORS[i % len(COLORS)]}">'
        f"</span>{html.escape(line.label)}</span>"
        for i, line in enumerate(lines)
    ]
    return f'<div class="legend">{"".join(items)}</div>'


def _stats_html(stats: Sequence[Stat]) -> str:
    rows = []
    for stat in stats:
        values = ", ".join(
            f"<b>{html.escape(value)}</b> <span class='who'>{html.escape(who)}</span>"
            for who, value in stat.values
        )
        rows.append(f"<tr><th>{html.escape(stat.title)}</th><td>{values or 'no data'}</td></tr>")
    return f'<div class="card stats"><table>{"".join(rows)}</table></div>'


def page_size(page: Page) -> tuple[int, int]:
    cells = len(page.charts) + (1 if page.stats else 0)
    rows = math.ceil(cells / 2)
    return 2 * CARD_W + GAP + 2 * PAD, HEADER_H + rows * (CARD_H + GAP) + PAD


def render_html(page: Page, subtitle: str) -> str:
    cards = [
        f'<div class="card">{line_chart(c.title, c.lines, y_unit=c.y_unit, legend=False)}'
        f"{_legend_html(c.lines)}</div>"
        for c in page.charts
    ]
    if page.stats:
        cards.append(_stats_html(page.stats))
    width, height = page_size(page)
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(page.dashboard)}</title>
<style>
html, body {{ margin: 0; background: #fff; font-family: sans-serif; color: #222; }}
.page {{ width: {width - 2 * PAD}px; height: {height - 2 * PAD}px; padding: {PAD}px;
  overflow: hidden; }}
header {{ height: {HEADER_H - PAD}px; }}
h1 {{ font-size: 20px; margin: 0 0 4px 0; }}
header p {{ font-size: 12px; color: #666; margin: 0; }}
.grid {{ display: grid; grid-template-columns: {CARD_W}px {CARD_W}px; gap: {GAP}px; }}
.card {{ width: {CARD_W - 2}px; height: {CARD_H - 2}px; border: 1px solid #ddd;
  border-radius: 4px; overflow: hidden; box-sizing: border-box; padding: 4px 8px; }}
.card svg {{ display: block; margin-left: -8px; }}
.legend {{ font-size: 11px; height: {LEGEND_H}px; overflow: hidden; line-height: 16px; }}
.legend .item {{ display: inline-block; margin-right: 14px; white-space: nowrap; }}
.swatch {{ display: inline-block; width: 10px; height: 3px; margin-right: 4px;
  vertical-align: middle; }}
.stats table {{ border-collapse: collapse; width: 100%; margin-top: 8px; }}
.stats th {{ text-align: left; font-size: 13px; padding: 8px 8px 8px 0; width: 42%;
  vertical-align: top; }}
.stats td {{ font-size: 13px; padding: 8px 0; }}
.stats b {{ font-size: 18px; }}
.stats .who {{ color: #666; font-size: 11px; }}
</style></head>
<body><div class="page"><header><h1>{html.escape(page.dashboard)}</h1>
<p>{html.escape(subtitle)}</p></header>
<div class="grid">{"".join(cards)}</div></div></body></html>
"""


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        raise RuntimeError("chromium is not installed: `make system-deps` installs it")
    return found


def screenshot(html_path: Path, png_path: Path, size: tuple[int, int]) -> None:
    """Headless Chromium's screenshot of `html_path` at `size` (width, height) pixels."""
    with tempfile.TemporaryDirectory(prefix="snapshot-chromium-") as profile:
        command = [
            chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
            f"--window-size={size[0]},{size[1]}", f"--screenshot={png_path}", html_path.as_uri(),
        ]  # fmt: skip
        subprocess.run(command, capture_output=True, text=True, timeout=180, check=True)
    if not png_path.exists() or png_path.stat().st_size == 0:
        raise RuntimeError(f"chromium wrote no screenshot to {png_path}")


def write_snapshots(
    api: Queries, out: Path, start: float, end: float, step: float = 1.0, note: str = ""
) -> list[Path]:
    """One PNG (and the HTML it was drawn from) per dashboard in MAIN_PANELS, in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    dashboards = load_dashboards()
    when = datetime.fromtimestamp(end, UTC).strftime("%Y-%m-%d %H:%M UTC")
    subtitle = f"{int(end - start)} s of live Prometheus data ending {when}" + (
        f"; {note}" if note else ""
    )
    written = []
    for name in MAIN_PANELS:
        page = collect(api, name, dashboards[name], start, end, step)
        html_path = out / f"{page.name}.html"
        png_path = out / f"{page.name}.png"
        html_path.write_text(render_html(page, subtitle), encoding="utf-8")
        screenshot(html_path, png_path, page_size(page))
        written.append(png_path)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m monitoring.snapshot", description=__doc__)
    parser.add_argument(
        "--prometheus", default=f"http://127.0.0.1:{PROMETHEUS_PORT}", help="its base URL"
    )
    parser.add_argument("--out", type=Path, default=Path("var/monitoring"), help="directory")
    parser.add_argument("--minutes", type=float, default=15.0, help="the range, ending now")
    parser.add_argument("--step", type=float, default=0.0, help="seconds (default: range/300)")
    args = parser.parse_args(argv)
    end = time.time()
    start = end - 60 * args.minutes
    step = args.step or max(1.0, (end - start) / 300)
    for path in write_snapshots(PrometheusAPI(args.prometheus), args.out, start, end, step):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
