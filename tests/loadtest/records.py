"""A small recorded run (ten requests, six engine scrapes) for analysis tests."""

from __future__ import annotations

from pathlib import Path

from loadtest.cpu import CpuSummary
from loadtest.records import RequestRecord
from loadtest.runner import RunData
from loadtest.scraper import KV_USAGE, RUNNING, WAITING, Scrape


def run_data(tmp_path: Path, *, cpu_bound: bool = False, failed: int | None = 3) -> RunData:
    """Request number `failed` (None: none) fails."""
    records = [
        RequestRecord(
            start=100.0 + i * 0.5,
            scenario="chat",
            ok=i != failed,
            error=None if i != failed else "x",
            status=200,
            ttft_s=0.05,
            e2e_s=0.4,
            itl_s=[0.01] * 31,
            prompt_tokens=64,
            output_tokens=32,
        )
        for i in range(10)
    ]
    scrapes = [
        Scrape(100.0 + t, "engine", {KV_USAGE: 0.1 * t, RUNNING: t, WAITING: 0.0}) for t in range(6)
    ]
    cpu = CpuSummary(
        1, 95.0 if cpu_bound else 20.0, 50.0, cpu_bound, [(101.0, 20.0), (102.0, 30.0)]
    )
    return RunData(100.0, 106.0, 0, records, scrapes, {}, cpu, tmp_path / "locust.log")
