"""The HTML report: self-contained, and it renders (opened in headless Chromium)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from loadtest.analysis import analyze
from loadtest.report import write_report
from loadtest.svg import Line, line_chart, nice_max
from loadtest.targets import Targets
from tests.loadtest.records import run_data
from tests.services import require

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def test_svg_chart_breaks_lines_at_gaps_and_scales_nicely() -> None:
    assert [nice_max(v) for v in (0.3, 7, 12, 450)] == [0.5, 10.0, 20.0, 500.0]
    svg = line_chart(
        "TTFT <p99>", [Line("p99", [(0, 1.0), (1, 2.0), (2, None), (3, 1.0), (4, 2.0)])]
    )
    assert svg.count("<polyline") == 2 and "TTFT &lt;p99&gt;" in svg
    assert "no data" in line_chart("empty", [Line("x", [])])


def test_report_json_and_html_are_written(tmp_path: Path) -> None:
    report = analyze(
        run_data(tmp_path, cpu_bound=True), Targets(max_error_rate=0.01), meta={"workload": "w"}
    )
    json_path, html_path = write_report(report, tmp_path)
    data = json.loads(json_path.read_text())
    assert data["verdict"]["passed"] is False and data["summary"]["failed"] == 1
    assert data["engine"]["kv_cache_usage_max"] == 0.5
    html = html_path.read_text()
    assert "<script" not in html and "http" not in html.replace("http://www.w3.org/2000/svg", "")
    assert "CPU-bound" in html and html.count("<svg") == 6


@pytest.mark.browser
def test_report_renders_in_headless_chromium(tmp_path: Path) -> None:
    require("browser")
    # make test installs Chromium (Makefile system-deps); its absence is a set-up failure.
    assert CHROMIUM is not None, "chromium is not installed: run make system-deps"
    report = analyze(
        run_data(tmp_path), Targets(max_error_rate=0.5, max_kv_cache_usage=0.9), meta={}
    )
    _, html_path = write_report(report, tmp_path)
    profile = tmp_path / "chromium-profile"
    command = [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={profile}",
        "--dump-dom",
        html_path.as_uri(),
    ]
    dom = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True).stdout
    assert dom.count("<svg") == 6 and dom.count('class="series"') >= 5
    assert 'id="verdict"><span class="pass">PASS</span>' in dom
    assert "KV cache usage (max)" in dom and "verdict-table" in dom
