"""Markdown for the benchmarks' results files, shared by every benchmark that writes tables.

    lines = table(["path", "p50 ms"], [["direct", num(0.42, ".2f")]])
    lines += spread_table(part)     # each run's value behind a side-by-side table's medians

A Markdown table reads well in a terminal too, so one format serves both.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

Doc = Mapping[str, Any]


def num(value: object, spec: str, suffix: str = "") -> str:
    """`value` formatted with `spec`; "-" when it is missing or NaN (not measured)."""
    if not isinstance(value, int | float) or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec) + suffix


def pct(value: object, spec: str = ".0f") -> str:
    """A share (0.25) as a percentage ("25%")."""
    return num(value * 100 if isinstance(value, int | float) else value, spec, "%")


def table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    def row(cells: Sequence[str]) -> str:
        return "| " + " | ".join(cells) + " |"

    return [row(head), row(["---"] * len(head)), *(row(r) for r in rows)]


def spread_table(part: Doc) -> list[str]:
    """Each run's value of every path, so the spread behind the medians is visible: `part`
    holds `paths`, each with its `label` and `runs` per measurement (latency, json, stream),
    as the gateway overhead and routing benchmarks record them."""

    def runs(path: Mapping[str, Any], metric: str, key: str, spec: str) -> str:
        return ", ".join(num(run.get(key), spec) for run in path["runs"][metric])

    rows = [
        [
            path["label"],
            runs(path, "latency", "p50_ms", ".2f"),
            runs(path, "latency", "p99_ms", ".2f"),
            runs(path, "json", "per_s", ",.0f"),
            runs(path, "stream", "per_s", ",.0f"),
        ]
        for path in part["paths"].values()
    ]
    head = ["path (each run)", "p50 ms", "p99 ms", "req/s", "streams/s"]
    return ["Spread: each run's value, in the order measured.", "", *table(head, rows)]
