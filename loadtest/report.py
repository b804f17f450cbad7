"""Write a run's report: report.json (all numbers) and report.html (one self-contained file).

The HTML has no scripts and loads nothing: inline CSS and SVG charts (loadtest.svg), so it
opens from a CI artifact or an email attachment as it is.

Usage: `paths = write_report(report, out_dir)`.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from html import escape
from pathlib import Path

from loadtest.analysis import Report
from loadtest.stats import Distribution
from loadtest.svg import Line, line_chart

CSS = """
body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1400px}
table{border-collapse:collapse;margin:8px 0 16px}td,th{border:1px solid #ccc;padding:3px 8px;
text-align:right}th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}
.pass{color:#137333;font-weight:bold}.miss{color:#b3261e;font-weight:bold}
.warning{background:#fff4e5;border:1px solid #f0a030;padding:8px;margin:8px 0}
.charts{display:flex;flex-wrap:wrap;gap:12px}
"""


def write_report(report: Report, out: Path) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    json_path, html_path = out / "report.json", out / "report.html"
    data = asdict(report)
    data["verdict"]["passed"] = report.verdict.passed
    json_path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    html_path.write_text(render_html(report), encoding="utf-8")
    return json_path, html_path


def _cell(value: float | None, digits: str = ",.1f") -> str:
    return "-" if value is None else format(value, digits)


def html_table(headers: list[str], rows: list[list[str]], css_id: str = "") -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    ident = f' id="{css_id}"' if css_id else ""
    return f"<table{ident}><tr>{head}</tr>{body}</table>"


def _latency_rows(report: Report) -> list[list[str]]:
    s = report.summary
    rows: list[tuple[str, Distribution]] = [
        ("TTFT", s.ttft),
        ("ITL", s.itl),
        ("TPOT", s.tpot),
        ("end-to-end", s.e2e),
    ]
    return [
        [name, f"{d.count:,}", _cell(d.mean_ms), _cell(d.p50_ms), _cell(d.p90_ms), _cell(d.p99_ms)]
        for name, d in rows
    ]


def _charts(report: Report) -> list[str]:
    series = report.series

    def points(values: list[float | None]) -> list[tuple[float, float | None]]:
        return list(zip(series.t, values, strict=True))

    ms = report.metric_series
    return [
        line_chart(
            "Output throughput",
            [Line("tokens/s", points(list(series.output_tokens_per_s)))],
            y_unit="",
        ),
        line_chart(
            "Time to first token",
            [Line("p50", points(series.ttft_p50_ms)), Line("p99", points(series.ttft_p99_ms))],
            y_unit=" ms",
        ),
        line_chart(
            "Inter-token latency",
            [Line("p50", points(series.itl_p50_ms)), Line("p99", points(series.itl_p99_ms))],
            y_unit=" ms",
        ),
        line_chart(
            "KV cache usage",
            [
                Line(
                    "vllm:kv_cache_usage_perc",
                    [(t, v * 100) for t, v in ms.get("engine vllm:kv_cache_usage_perc", [])],
                )
            ],
            y_unit="%",
        ),
        line_chart(
            "Requests in the engine",
            [
                Line("running", list(ms.get("engine vllm:num_requests_running", []))),
                Line("waiting", list(ms.get("engine vllm:num_requests_waiting", []))),
            ],
        ),
        line_chart(
            "Load generator CPU (busiest process)",
            [Line("% of a core", list(ms.get("loadgen cpu_percent", [])))],
            y_unit="%",
        ),
    ]


def render_html(report: Report) -> str:
    s, e, v = report.summary, report.engine, report.verdict
    verdict_rows = [
        [
            escape(c.name),
            escape(c.target),
            escape(c.measured),
            '<span class="pass">ok</span>' if c.passed else '<span class="miss">MISS</span>',
        ]
        for c in v.checks
    ]
    overall = '<span class="pass">PASS</span>' if v.passed else '<span class="miss">FAIL</span>'
    meta_rows = [[escape(str(k)), escape(str(val))] for k, val in report.meta.items()]
    totals = [
        ["requests (ok / failed)", f"{s.succeeded:,} / {s.failed:,}"],
        ["error rate", f"{s.error_rate * 100:.2f}%"],
        ["duration", f"{s.duration_s:.1f} s"],
        ["requests/s", _cell(s.request_rate, ",.2f")],
        ["output tokens/s", _cell(s.output_tokens_per_s)],
        ["total tokens/s", _cell(s.total_tokens_per_s)],
        ["prompt / output tokens", f"{s.prompt_tokens:,} / {s.output_tokens:,}"],
    ]
    engine_rows = [
        [
            "KV cache usage max / mean",
            f"{_cell(None if e.kv_cache_usage_max is None else e.kv_cache_usage_max * 100)}% / "
            f"{_cell(None if e.kv_cache_usage_mean is None else e.kv_cache_usage_mean * 100)}%",
        ],
        [
            "running max / waiting max",
            f"{_cell(e.running_max, '.0f')} / {_cell(e.waiting_max, '.0f')}",
        ],
        ["preemptions", _cell(e.preemptions, ".0f")],
        [
            "prompt / generation tokens (counter increase)",
            f"{_cell(e.prompt_tokens, ',.0f')} / {_cell(e.generation_tokens, ',.0f')}",
        ],
        [
            "prefix cache hit rate",
            _cell(None if e.prefix_cache_hit_rate is None else e.prefix_cache_hit_rate * 100) + "%",
        ],
        ["scrapes", str(e.scrapes)],
    ]
    gateway_rows = [[escape(k), _cell(val, ",.0f")] for k, val in report.gateway.items()]
    errors = [[escape(msg), f"{n:,}"] for msg, n in report.summary.errors.items()]
    warnings = "".join(f'<div class="warning">⚠ {escape(w)}</div>' for w in report.warnings)
    cpu_mark = (
        '<p id="loadgen-bottleneck" class="miss">Load generator was CPU-bound</p>'
        if report.cpu.get("bottleneck")
        else ""
    )
    title = f"Load test: {report.meta.get('workload', '')}"
    return "".join(
        [
            f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{escape(title)}</title>",
            f"<style>{CSS}</style></head><body><h1>{escape(title)}</h1>",
            warnings,
            cpu_mark,
            f'<h2>Verdict: <span id="verdict">{overall}</span></h2>',
            html_table(["check", "target", "measured", "result"], verdict_rows, "verdict-table"),
            "<h2>Throughput</h2>",
            html_table(["metric", "value"], totals, "totals"),
            "<h2>Latency (ms)</h2>",
            html_table(
                ["", "samples", "mean", "p50", "p90", "p99"], _latency_rows(report), "latency"
            ),
            '<h2>Over time</h2><div class="charts">',
            "".join(_charts(report)),
            "</div>",
            "<h2>Engine</h2>",
            html_table(["metric", "value"], engine_rows, "engine"),
            (
                "<h2>Gateway (increase over the run)</h2>"
                + html_table(["series", "value"], gateway_rows)
            )
            if gateway_rows
            else "",
            ("<h2>Errors</h2>" + html_table(["error", "count"], errors)) if errors else "",
            "<h2>Run</h2>",
            html_table(["setting", "value"], meta_rows, "meta"),
            "</body></html>\n",
        ]
    )
