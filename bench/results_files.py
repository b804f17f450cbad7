"""One results file per run, named by the day it ran: bench/results/<benchmark>/<date>.md.

Each run of a benchmark writes `<date>.json` and `<date>.md` (UTC, from the run's `created`
time) into its benchmark's directory; a second run the same day writes `<date>-2.*`, a third
`<date>-3.*`. Nothing is overwritten, so bench/results/ keeps every recorded run and the docs
quote the newest (tests/test_docs_results.py checks that they do):

    stem = run_stem(RESULTS_DIR / "routing", "2026-12-01T04:45:21+00:00")  # "2026-12-01"
    newest = latest(RESULTS_DIR / "routing")  # .../routing/2026-12-01.md
"""

from __future__ import annotations

import os
import platform
import re
from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parent / "results"
SUFFIXES = (".json", ".md")
RUN_NAME = re.compile(r"(?P<date>\d{4}-\d{2}-\d{2})(?:-(?P<n>[2-9]|[1-9]\d+))?")


def run_stem(directory: Path, created: str) -> str:
    """The first free name for a run made at `created` (ISO 8601): its date, then -2, -3..."""
    date = created[:10]
    if not RUN_NAME.fullmatch(date):
        raise ValueError(f"not an ISO 8601 time: {created!r}")
    stem, n = date, 1
    while any((directory / f"{stem}{suffix}").exists() for suffix in SUFFIXES):
        n += 1
        stem = f"{date}-{n}"
    return stem


def run_order(path: Path) -> tuple[str, int]:
    """Sort key of a results file: its date, then its run of that day."""
    match = RUN_NAME.fullmatch(path.stem)
    if match is None:
        raise ValueError(f"not a results file named by date: {path}")
    return match["date"], int(match["n"] or 1)


def runs(directory: Path, suffix: str = ".md") -> list[Path]:
    """The directory's results files with `suffix`, oldest first."""
    return sorted(directory.glob(f"*{suffix}"), key=run_order)


def latest(directory: Path, suffix: str = ".md") -> Path:
    """The newest results file with `suffix` in `directory`."""
    found = runs(directory, suffix)
    if not found:
        raise FileNotFoundError(f"no *{suffix} results in {directory}")
    return found[-1]


def loadavg() -> list[float]:
    """The machine's load average now (1, 5 and 15 minutes), as a results file notes it."""
    return [round(value, 2) for value in os.getloadavg()]


def machine() -> dict[str, object]:
    """The machine a run is on, as its results file notes it: cores, CPU model, Python."""
    model = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu_model": model, "python": platform.python_version()}


def machine_lines(noted: object) -> list[str]:
    """A results file's line on its machine and load (`noted`: machine() plus load averages)."""
    assert isinstance(noted, dict)
    where = f"Machine: {noted.get('cpus', '?')} cores"
    if "cpu_model" in noted:
        where += f" ({noted['cpu_model']}), Python {noted['python']}"
    loads = [
        f"{when} {noted[f'loadavg_{when}']}"
        for when in ("before", "after")
        if f"loadavg_{when}" in noted
    ]
    return [f"{where}; load average {', '.join(loads)}.", ""]
