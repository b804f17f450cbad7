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

from monitoring.generated_files import stale_files, write_files
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
    return write_files(render_all(), directory)


def stale(directory: Path) -> list[str]:
    """Files in `directory` that regenerating would change, add or remove."""
    return stale_files(render_all(), directory, "*.json")
