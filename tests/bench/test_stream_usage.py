"""The running-usage benchmark's report and its refusals (the measurement itself needs a real
engine and minutes: `make bench-stream-usage`; speed is what it reports, not asserted)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.stream_usage.__main__ import BASELINE, VARIANTS, main, report


def _sample(cpu_s: float) -> dict[str, float]:
    return {"api_cpu_s": cpu_s, "wall_s": 1.0, "chunks": 100, "completion_tokens": 100}


def test_report_gives_each_variant_its_median_and_its_ratio_to_last_chunk_usage() -> None:
    cpu = {name: [1.0, 3.0, 2.0] for name in VARIANTS}
    cpu["usage in every chunk, thinking off"] = [7.0, 5.0, 6.0]
    doc: dict[str, object] = {
        "command": "python -m bench.stream_usage",
        "created": "2026-12-05T00:00:00+00:00",
        "plan": {"rounds": 3},
        "machine": {"loadavg_after": [0.5, 0.5, 0.5]},
        "samples": {"100": {name: [_sample(v) for v in values] for name, values in cpu.items()}},
    }
    lines = report(doc).splitlines()
    rows = {line.split(" | ")[1]: line for line in lines if line.startswith("| 100 |")}
    assert set(rows) == set(VARIANTS)
    assert "| 2.00 s | 1.00x | 20000 µs |" in rows[BASELINE]
    assert "| 6.00 s | 3.00x | 60000 µs |" in rows["usage in every chunk, thinking off"]


@pytest.mark.parametrize("args", [["--rounds", "0"], ["--tokens", "0"], ["--tokens", "x"]])
def test_bad_arguments_are_refused_before_any_engine_starts(
    args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*args, "--output-dir", str(tmp_path)]) == 2
    assert "--rounds and --tokens" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
