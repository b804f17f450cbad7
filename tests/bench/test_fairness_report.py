"""The fair sharing benchmark's report: every flood, the worst request, the goal run by run.

The measurement itself needs a real engine for minutes (`make bench-fairness`); what is
checked here is that its numbers are read and judged as docs/fair-sharing.md says.
"""

from __future__ import annotations

from bench.fairness.__main__ import report, verdicts
from bench.fairness.replicas import FLOOD_ON_BOTH, FLOOD_ON_ONE


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


def with_replicas(
    fair_worst: float, *, both_median: float = 28, shared: list[float] | None = None
) -> dict[str, dict[str, object]]:
    """A run with the replica settings under 16 and 32 streams beside the single gateway's."""
    rows = run(fair_worst)
    for flood, fcfs_tokens in ((16, 1000), (32, 2000)):
        if flood != 16:
            rows[f"fcfs, {flood} streams"] = measured(
                2000, 4000, fcfs_tokens, setting="fcfs", flood=flood
            )
        rows[f"{FLOOD_ON_ONE}, {flood} streams"] = measured(
            20, 60, 0.92 * fcfs_tokens, setting=FLOOD_ON_ONE, flood=flood, shared_up=[1.0, 1.0]
        )
        rows[f"{FLOOD_ON_BOTH}, {flood} streams"] = measured(
            both_median, 75, 0.85 * fcfs_tokens, setting=FLOOD_ON_BOTH, flood=flood,
            shared_up=shared or [1.0, 1.0],
        )  # fmt: skip
    return rows


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


def test_the_replica_settings_are_judged_against_alone_and_fcfs_under_the_same_flood() -> None:
    held, missed = with_replicas(80), with_replicas(80, both_median=45)  # 45 ms: 3x alone
    assert verdicts([held, missed])[3:] == [
        f"| {FLOOD_ON_ONE}, 16 streams | 2/2 runs | 2/2 runs | 2/2 runs |",
        # 85% of FCFS's tokens/s in every run; the median missed in the second
        f"| {FLOOD_ON_BOTH}, 16 streams | 1/2 runs **MISS** | 2/2 runs | 0/2 runs **MISS** |",
        f"| {FLOOD_ON_ONE}, 32 streams | 2/2 runs | 2/2 runs | 2/2 runs |",
        f"| {FLOOD_ON_BOTH}, 32 streams | 1/2 runs **MISS** | 2/2 runs | 0/2 runs **MISS** |",
    ]


def test_the_report_shows_the_replica_rows_and_says_when_they_were_not_sharing() -> None:
    doc: dict[str, object] = {
        "command": "python -m bench.fairness", "created": "2026-12-07T10:00:00+00:00",
        "plan": {"replicas": 2, "redis": "7.0.15"}, "machine": {"cpus": 2},
        "runs": [with_replicas(80), with_replicas(80)],
    }  # fmt: skip
    lines = report(doc).splitlines()
    row = next(line for line in lines if line.startswith(f"| {FLOOD_ON_ONE}, 32 streams"))
    # 60 ms worst against 30 alone; 1840 tokens/s against FCFS's 2000 under the same 32 streams
    assert row == (
        f"| {FLOOD_ON_ONE}, 32 streams | 20 (20, 20) | 1.33x (worst run 1.33x) "
        "| 60 (60, 60) | 2.00x (worst run 2.00x) | 1840 | 92% |"
    )
    assert not any("Not sharing" in line for line in lines)
    doc["runs"] = [with_replicas(80), with_replicas(80, shared=[1.0, 0.0])]
    warning = next(line for line in report(doc).splitlines() if "Not sharing" in line)
    assert f"{FLOOD_ON_BOTH}, 16 streams (run 2: [1.0, 0.0])" in warning
    assert f"{FLOOD_ON_ONE}" not in warning
