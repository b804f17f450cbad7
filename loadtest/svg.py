"""Line charts as inline SVG strings: no JavaScript, no CDN, readable offline and in CI.

Usage: `line_chart("TTFT", [Line("p50", [(0, 12.0), (1, None)])], y_unit="ms")`; a None
value breaks the line (an empty bucket).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

WIDTH, HEIGHT = 640, 240
LEFT, RIGHT, TOP, BOTTOM = 56, 16, 28, 36
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b")


@dataclass(frozen=True)
class Line:
    label: str
    points: Sequence[tuple[float, float | None]]


def nice_max(value: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten at or above `value`."""
    if value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if value <= step * power:
            return float(step * power)
    return 10.0 * power


def _fmt(value: float) -> str:
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"


def line_chart(
    title: str,
    lines: Sequence[Line],
    *,
    x_unit: str = "s",
    y_unit: str = "",
    legend: bool = True,
) -> str:
    """The chart as an <svg> element; `legend=False` leaves the legend to the caller (the
    line colors are COLORS in order)."""
    xs = [x for line in lines for x, _ in line.points]
    ys = [y for line in lines for _, y in line.points if y is not None]
    x_max = max(xs, default=1.0) or 1.0
    y_max = nice_max(max(ys, default=1.0))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def px(x: float) -> float:
        return LEFT + plot_w * x / x_max

    def py(y: float) -> float:
        return TOP + plot_h * (1 - y / y_max)

    parts = [
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(title)}">',
        f'<text x="{LEFT}" y="16" font-size="13" font-weight="bold">{escape(title)}</text>',
        f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" '
        'fill="none" stroke="#ccc"/>',
    ]
    for i in range(5):
        tick = y_max * i / 4
        parts.append(
            f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{py(tick):.1f}" y2="{py(tick):.1f}" '
            f'stroke="#eee"/><text x="{LEFT - 4}" y="{py(tick) + 4:.1f}" font-size="10" '
            f'text-anchor="end">{_fmt(tick)}{escape(y_unit)}</text>'
        )
    for i in range(5):
        at = x_max * i / 4
        parts.append(
            f'<text x="{px(at):.1f}" y="{HEIGHT - BOTTOM + 14}" font-size="10" '
            f'text-anchor="middle">{_fmt(at)}{escape(x_unit)}</text>'
        )
    for index, line in enumerate(lines):
        color = COLORS[index % len(COLORS)]
        segments: list[list[str]] = [[]]
        for x, y in line.points:
            if y is None:
                segments.append([])
            else:
                segments[-1].append(f"{px(x):.1f},{py(y):.1f}")
        for segment in segments:
            if len(segment) == 1:
                cx, cy = segment[0].split(",")
                parts.append(f'<circle cx="{cx}" cy="{cy}" r="2" fill="{color}"/>')
            elif segment:
                parts.append(
                    f'<polyline class="series" fill="none" stroke="{color}" stroke-width="1.5" '
                    f'points="{" ".join(segment)}"/>'
                )
        if not legend:
            continue
        lx = LEFT + 8 + index * 120
        parts.append(
            f'<rect x="{lx}" y="{HEIGHT - 14}" width="10" height="3" fill="{color}"/>'
            f'<text x="{lx + 14}" y="{HEIGHT - 10}" font-size="10">{escape(line.label)}</text>'
        )
    if not ys:
        parts.append(
            f'<text x="{LEFT + plot_w / 2}" y="{TOP + plot_h / 2}" text-anchor="middle" '
            f'font-size="12" fill="#888">no data</text>'
        )
    parts.append("</svg>")
    return "".join(parts)
