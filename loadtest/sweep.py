"""Concurrency sweep: constant-user runs at rising levels; goodput is the highest that passes.

Each level is its own run (own steady state, report and verdict in `<out>/users-<N>/`). A
level counts toward goodput when it meets the latency, KV, preemption and error targets;
the throughput floor is not applied per level (low levels are not meant to reach it). The
sweep stops early after the first level that misses, since higher ones only get slower.

Usage: `result = run_sweep(plan, template, levels=[1, 2, 4, 8])`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from html import escape
from pathlib import Path
from typing import Any

from loadtest.analysis import Report, analyze
from loadtest.plan import Plan
from loadtest.report import CSS, write_report
from loadtest.runner import LocustRun, run_locust
from loadtest.svg import Line, line_chart


@dataclass(frozen=True)
class Level:
    users: int
    report: Report

    def row(self) -> dict[str, Any]:
        s = self.report.summary
        return {
            "users": self.users,
            "passed": self.report.verdict.passed,
            "output_tokens_per_s": s.output_tokens_per_s,
            "ttft_p99_ms": s.ttft.p99_ms,
            "itl_p99_ms": s.itl.p99_ms,
            "error_rate": s.error_rate,
            "loadgen_cpu_bound": self.report.cpu["bottleneck"],
        }


@dataclass(frozen=True)
class SweepResult:
    levels: list[Level]

    @property
    def goodput(self) -> Level | None:
        passing = [level for level in self.levels if level.report.verdict.passed]
        return max(passing, key=lambda level: level.users, default=None)


def run_sweep(
    plan: Plan,
    template: LocustRun,
    levels: list[int],
    *,
    meta: dict[str, Any],
    keep_going: bool = False,
) -> SweepResult:
    done: list[Level] = []
    targets = plan.targets.latency_only()
    for users in levels:
        out = template.out / f"users-{users}"
        data = run_locust(replace(template, users=users, out=out))
        report = analyze(data, targets, meta={**meta, "users": users})
        write_report(report, out)
        done.append(Level(users, report))
        print(
            f"users={users}: {'pass' if report.verdict.passed else 'MISS'} "
            f"{report.summary.output_tokens_per_s:,.1f} tok/s",
            flush=True,
        )
        if not report.verdict.passed and not keep_going:
            break
    result = SweepResult(done)
    write_sweep(result, template.out)
    return result


def write_sweep(result: SweepResult, out: Path) -> Path:
    rows = [level.row() for level in result.levels]
    best = result.goodput
    summary = {"goodput_users": best.users if best else None, "levels": rows}
    (out / "sweep.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    users = [float(r["users"]) for r in rows]
    charts = [
        line_chart(
            "Output tokens/s by users",
            [
                Line(
                    "tok/s", list(zip(users, [r["output_tokens_per_s"] for r in rows], strict=True))
                )
            ],
            x_unit=" users",
        ),
        line_chart(
            "p99 latency by users",
            [
                Line("TTFT p99", list(zip(users, [r["ttft_p99_ms"] for r in rows], strict=True))),
                Line("ITL p99", list(zip(users, [r["itl_p99_ms"] for r in rows], strict=True))),
            ],
            x_unit=" users",
            y_unit=" ms",
        ),
    ]
    table = "".join(
        f"<tr><td><a href='users-{r['users']}/report.html'>{r['users']}</a></td>"
        f"<td class='{'pass' if r['passed'] else 'miss'}'>{'ok' if r['passed'] else 'MISS'}</td>"
        f"<td>{r['output_tokens_per_s']:,.1f}</td><td>{r['ttft_p99_ms'] or 0:,.1f}</td>"
        f"<td>{r['itl_p99_ms'] or 0:,.1f}</td><td>{r['error_rate'] * 100:.2f}%</td>"
        f"<td>{'yes' if r['loadgen_cpu_bound'] else ''}</td></tr>"
        for r in rows
    )
    headline = f"goodput: {best.users} users" if best else "goodput: no level met the targets"
    html = (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>Sweep</title><style>{CSS}"
        f"</style></head><body><h1>Concurrency sweep</h1><h2 id='goodput'>{escape(headline)}</h2>"
        "<table id='sweep'><tr><th>users</th><th>verdict</th><th>output tok/s</th>"
        "<th>TTFT p99 ms</th><th>ITL p99 ms</th><th>errors</th><th>loadgen CPU-bound</th></tr>"
        f"{table}</table><div class='charts'>{''.join(charts)}</div></body></html>\n"
    )
    path = out / "sweep.html"
    path.write_text(html, encoding="utf-8")
    return path
