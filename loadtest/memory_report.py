"""The memory-plan report: report.json and report.html, the plan beside the measurement.

Same style as the run report (loadtest.report's CSS and tables, loadtest.svg charts); the
ramp's ordinary run report (latencies, throughput over time) is written to `run/`.

Usage: `json_path, html_path = write_memory_report(result, out_dir)`.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from html import escape
from pathlib import Path
from typing import Any

from loadtest import scraper as m
from loadtest.memory import MemoryResult, Step
from loadtest.report import CSS, html_table
from loadtest.svg import Line, line_chart


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def _num(value: float | None, digits: str = ".1f") -> str:
    return "-" if value is None else format(value, digits)


def result_dict(result: MemoryResult) -> dict[str, Any]:
    return {
        "prediction": result.prediction.as_dict(),
        "engine_blocks": result.engine_blocks,
        "levels": result.levels,
        "steps": [asdict(step) for step in result.steps],
        "measured": asdict(result.measured),
        "verdict": {
            "passed": result.verdict.passed,
            "checks": [asdict(check) for check in result.verdict.checks],
        },
        "meta": result.meta,
        "windows": result.windows,
        "warnings": result.warnings,
    }


def step_rows(steps: list[Step]) -> list[list[str]]:
    """Plan vs measured, one row per step (also docs/load-testing.md's table)."""
    return [
        [
            str(s.users),
            f"{s.predicted_running} / {s.predicted_waiting}",
            f"{_num(s.running, '.0f')} / {_num(s.waiting, '.0f')}",
            _pct(s.predicted_usage),
            f"{_pct(s.kv_usage)} (max {_pct(s.kv_usage_max)})",
            f"{s.predicted_blocks_per_sequence} / {_num(s.blocks_per_sequence)}",
            _num(s.preemptions, ".0f"),
            _num(s.engine_tokens_per_s),
            f"{s.client_tokens_per_s:.1f}",
            f"{s.requests} ({s.failed} failed)",
            f"{s.seconds:.1f} s / {s.scrapes}",
        ]
        for s in steps
    ]


STEP_HEADERS = [
    "users",
    "plan: running / waiting",
    "measured: running / waiting (median)",
    "plan: KV usage",
    "measured: KV usage (median)",
    "KV blocks per running sequence: plan / measured",
    "preemptions",
    "output tok/s (engine)",
    "output tok/s (client)",
    "requests ended",
    "measured for / scrapes",
]


def markdown_table(result: MemoryResult) -> str:
    """The step table as Markdown (printed by the command, pasted into docs/load-testing.md)."""
    rows = [STEP_HEADERS, *step_rows(result.steps)]
    lines = ["| " + " | ".join(row) + " |" for row in rows]
    lines.insert(1, "|" + "---|" * len(STEP_HEADERS))
    return "\n".join(lines)


def _charts(result: MemoryResult) -> list[str]:
    steps = result.steps
    users = [float(s.users) for s in steps]
    p = result.prediction
    return [
        line_chart(
            "KV cache usage by users: plan vs measured",
            [
                Line(
                    "plan",
                    [(u, s.predicted_usage * 100) for u, s in zip(users, steps, strict=True)],
                ),
                Line(
                    "measured (median)",
                    [
                        (u, None if s.kv_usage is None else s.kv_usage * 100)
                        for u, s in zip(users, steps, strict=True)
                    ],
                ),
            ],
            x_unit=" users",
            y_unit="%",
        ),
        line_chart(
            "Requests in the engine by users",
            [
                Line(
                    "plan: running",
                    [(u, float(s.predicted_running)) for u, s in zip(users, steps, strict=True)],
                ),
                Line(
                    "running (median)", [(u, s.running) for u, s in zip(users, steps, strict=True)]
                ),
                Line(
                    "plan: waiting",
                    [(u, float(s.predicted_waiting)) for u, s in zip(users, steps, strict=True)],
                ),
                Line(
                    "waiting (median)", [(u, s.waiting) for u, s in zip(users, steps, strict=True)]
                ),
            ],
            x_unit=" users",
        ),
        line_chart(
            "Output tokens/s by users",
            [
                Line(
                    "engine",
                    [(u, s.engine_tokens_per_s) for u, s in zip(users, steps, strict=True)],
                ),
                Line(
                    "client",
                    [(u, s.client_tokens_per_s) for u, s in zip(users, steps, strict=True)],
                ),
            ],
            x_unit=" users",
        ),
        line_chart(
            "KV cache usage over time (plan: the plateau)",
            [
                Line("measured", [(t, v * 100) for t, v in result.timeline.get(m.KV_USAGE, [])]),
                Line(
                    "plan",
                    [(t, p.plateau_usage * 100) for t, _ in result.timeline.get(m.KV_USAGE, [])],
                ),
            ],
            y_unit="%",
        ),
    ]


def render_html(result: MemoryResult) -> str:
    p, got = result.prediction, result.measured
    v = result.verdict
    overall = '<span class="pass">PASS</span>' if v.passed else '<span class="miss">FAIL</span>'
    verdict_rows = [
        [
            escape(c.name),
            escape(c.target),
            escape(c.measured),
            '<span class="pass">ok</span>' if c.passed else '<span class="miss">MISS</span>',
        ]
        for c in v.checks
    ]
    s = p.sizing
    plan_rows = [
        ["KV blocks (vLLM's num_gpu_blocks)", f"{p.num_blocks}",
         "-" if result.engine_blocks is None else str(result.engine_blocks)],
        ["usable blocks (less vLLM's null block)", str(p.fit.usable_blocks), ""],
        ["block size", f"{p.block_size} tokens", ""],
        ["KV capacity (vLLM: KV cache size)", f"{p.kv_tokens:,} tokens", ""],
        ["a sequence", f"{s.prompt_tokens} prompt + {s.output_min}-{s.output_tokens} output "
         f"tokens = {p.fit.blocks_per_sequence} blocks", ""],
        ["sequences running at once", f"{p.sequences} (bound by {escape(p.binding)})",
         _num(got.sequences, ".0f")],
        ["requests wait from", f"{p.waiting_from} users",
         "-" if got.waiting_from is None else f"{got.waiting_from} users"],
        ["preemptions from", "never (sequences hold their blocks from admission)",
         "never" if got.preempting_from is None else f"{got.preempting_from} users"],
        ["KV cache usage at the plateau (highest while requests wait)", _pct(p.plateau_usage),
         _pct(got.plateau_usage)],
        ["KV cache usage while requests wait (median of the scrapes)", _pct(p.plateau_usage),
         _pct(got.plateau_median)],
        ["KV cache usage, highest of the ramp", _pct(p.plateau_usage), _pct(got.usage_max)],
    ]  # fmt: skip
    warnings = "".join(f'<div class="warning">⚠ {escape(w)}</div>' for w in result.warnings)
    meta_rows = [[escape(str(k)), escape(str(val))] for k, val in result.meta.items()]
    title = f"Memory plan vs measurement: {p.profile}"
    return "".join(
        [
            f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{escape(title)}</title>",
            f"<style>{CSS}</style></head><body><h1>{escape(title)}</h1>",
            warnings,
            f'<h2>Verdict: <span id="verdict">{overall}</span></h2>',
            html_table(["check", "plan", "measured", "result"], verdict_rows, "verdict-table"),
            "<h2>The plan beside the measurement</h2>",
            html_table(["", "plan", "measured"], plan_rows, "plan"),
            "<h2>By step</h2>",
            html_table(STEP_HEADERS, step_rows(result.steps), "steps"),
            '<div class="charts">',
            "".join(_charts(result)),
            "</div>",
            "<p>Latencies and throughput over time: <a href='run/report.html'>run report</a>.</p>",
            "<h2>Run</h2>",
            html_table(["setting", "value"], meta_rows, "meta"),
            "</body></html>\n",
        ]
    )


def write_memory_report(result: MemoryResult, out: Path) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    json_path, html_path = out / "report.json", out / "report.html"
    json_path.write_text(json.dumps(result_dict(result), indent=2) + "\n", encoding="utf-8")
    html_path.write_text(render_html(result), encoding="utf-8")
    return json_path, html_path
