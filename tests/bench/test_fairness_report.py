"""The fair sharing benchmark's report: every flood, the worst request, the goal run by run.

The measurement itself needs a real engine for minutes (`make bench-fairness`); what is
checked here is that its numbers are read and judged as docs/fair-sharing.md says.
"""

from __future__ import annotations

from bench.fairness.__main__ import report, verdicts


def measured(median: float, worst: float, tokens: float, **row: object) -> dict[str, object]:
    return {"n": 40, "median_ms": median, "p99_ms": worst, "worst_ms": worst,
            "tokens_per_s": tokens, **row}  # fmt: skip


def run(fair_worst: float) -> dict[str, dict[str, object]]:
    return {
        "alone": measured(15, 30, 30),
        "fcfs, 16 streams": measured(900, 1800, 1000, setting="fcfs", flood=16),
        "fair, 1 reserved, 16 streams": measured(
            25, fair_worst, 950, setting="fair, 1 reserved", flood=16
        ),
    }


def test_the_worst_request_is_judged_in_every_run() -> None:
    held, missed = run(fair_worst=80), run(fair_worst=120)  # 2.67x and 4x the worst alone
    assert verdicts([held, held])[2:] == [
        "| fair, 1 reserved, 16 streams | 2/2 runs | 2/2 runs | 2/2 runs |"
    ]
    assert verdicts([held, missed])[2:] == [
        "| fair, 1 reserved, 16 streams | 2/2 runs | 1/2 runs **MISS** | 2/2 runs |"
    ]


def test_the_report_shows_each_flood_beside_fcfs_under_the_same_flood() -> None:
    doc: dict[str, object] = {
        "command": "python -m bench.fairness", "created": "2026-12-07T10:00:00+00:00",
        "plan": {}, "machine": {"cpus": 2}, "runs": [run(80), run(120)],
    }  # fmt: skip
    text = report(doc)
    row = next(line for line in text.splitlines() if line.startswith("| fair, 1 reserved, 16"))
    # worst 80 and 120 ms against 30 alone: median of the runs 3.33x, the worse run 4.00x
    assert row.startswith("| fair, 1 reserved, 16 streams | 25 (25, 25) | 1.67x (worst run 1.67x) ")
    assert "| 100 (80, 120) | 3.33x (worst run 4.00x) |" in row
    assert row.endswith("| 950 | 95% |")  # against FCFS under the same 16 streams
