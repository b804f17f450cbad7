"""Each benchmark run writes its own results files, named by the day it ran, and `latest`
finds the newest: bench/results/<benchmark>/<date>.md, then <date>-2.md the same day."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.gateway_overhead.report import write_results
from bench.results_files import latest, machine_lines, run_stem, runs


def test_runs_are_named_by_date_and_never_overwritten(tmp_path: Path) -> None:
    doc: dict[str, object] = {"created": "2026-12-06T04:12:24+00:00", "value": 1}
    first = write_results(doc, tmp_path, "bench_x", "# one\n")
    second = write_results(doc, tmp_path, "bench_x", "# two\n")
    assert [p.name for p in first] == ["2026-12-06.json", "2026-12-06.md"]
    assert [p.name for p in second] == ["2026-12-06-2.json", "2026-12-06-2.md"]
    assert first[1].read_text() == "# one\n"
    assert latest(tmp_path / "bench_x") == second[1]
    assert not list((tmp_path / "bench_x").glob("*.tmp"))


def test_latest_orders_by_date_then_run_of_the_day(tmp_path: Path) -> None:
    for name in ("2026-12-05.md", "2026-12-06-10.md", "2026-12-06-2.md", "2026-12-06.md"):
        (tmp_path / name).write_text("")
    assert [p.name for p in runs(tmp_path)] == [
        "2026-12-05.md", "2026-12-06.md", "2026-12-06-2.md", "2026-12-06-10.md"
    ]  # fmt: skip
    assert latest(tmp_path).name == "2026-12-06-10.md"
    assert run_stem(tmp_path, "2026-12-06T00:00:00+00:00") == "2026-12-06-3"
    with pytest.raises(FileNotFoundError):
        latest(tmp_path, ".json")
    with pytest.raises(ValueError):
        run_stem(tmp_path, "yesterday")


def test_the_machine_and_its_load_are_noted() -> None:
    noted = {"cpus": 2, "cpu_model": "X", "python": "3.11.7", "loadavg_before": [0.5],
             "loadavg_after": [1.5]}  # fmt: skip
    assert machine_lines(noted)[0] == (
        "Machine: 2 cores (X), Python 3.11.7; load average before [0.5], after [1.5]."
    )
    assert machine_lines({"cpus": 2, "loadavg_after": [1.0]})[0] == (
        "Machine: 2 cores; load average after [1.0]."
    )
