"""Debian's promtool for the monitoring tests: found on PATH, run with a timeout."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.services import require


def run_promtool(promtool: Path, *args: str | Path) -> subprocess.CompletedProcess[str]:
    require("prometheus")
    return subprocess.run(
        [str(promtool), *map(str, args)], capture_output=True, text=True, timeout=120, check=False
    )
