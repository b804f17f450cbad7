"""Render every dashboard to JSON text, write it, or say which committed files are stale.

texts = render_all()                   # {"engine.json": "...", ...}
write_all(DASHBOARDS_DIR)
stale(DASHBOARDS_DIR)                  # ["capacity.json"] when regenerating changes it
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from monitoring.grafana import capacity, engine, gateway

DASHBOARDS_DIR = Path(__file__).parent / "dashboards"
BUILDERS: dict[str, Callable[[], dict[str, Any]]] = {
    "engine.json": engine.build,
    "gateway.json": gateway.build,
    "capacity.json": capacity.build,
}


def render(dashboard: dict[str, Any]) -> str:
    return json.dumps(dashboard, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def render_all() -> dict[str, str]:
    return {name: render(build()) for name, build in BUILDERS.items()}


def write_all(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in render_all().items():
        path = directory / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def stale(directory: Path) -> list[str]:
    """Files in `directory` that regenerating would change, add or remove."""
    expected = render_all()
    present = {path.name for path in directory.glob("*.json")}
    changed = [
        name
        for name, text in expected.items()
        if name not in present or (directory / name).read_text(encoding="utf-8") != text
    ]
    return sorted(changed + sorted(present - expected.keys()))
