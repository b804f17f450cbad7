from __future__ import annotations

from loadtest.records import RequestRecord
from loadtest.stats import percentile, summarize, time_series


def record(start: float, *, ok: bool = True, out: int = 3) -> RequestRecord:
    return RequestRecord(
        start=start,
        scenario="chat",
        ok=ok,
        error=None if ok else "boom",
        status=200,
        ttft_s=0.1,
        e2e_s=0.3,
        itl_s=[0.1, 0.1],
        prompt_tokens=10,
        output_tokens=out,
    )


def test_percentile_interpolates_like_numpy() -> None:
    assert percentile([], 50) is None
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([1.0, 2.0, 3.0, 4.0], 99) == 3.97


def test_summary_counts_only_successes_in_throughput() -> None:
    summary = summarize([record(100.0), record(100.2), record(100.4, ok=False)])
    assert (summary.requests, summary.succeeded, summary.failed) == (3, 2, 1)
    assert abs(summary.error_rate - 1 / 3) < 1e-9
    assert abs(summary.duration_s - 0.5) < 1e-9  # 100.0 -> 100.5
    assert summary.output_tokens == 6
    assert abs(summary.output_tokens_per_s - 12.0) < 1e-6
    assert summary.itl.count == 4 and summary.ttft.p50_ms == 100.0
    assert summary.tpot.mean_ms is not None and abs(summary.tpot.mean_ms - 100.0) < 1e-6
    assert summary.errors == {"boom": 1}


def test_series_place_tokens_at_their_arrival() -> None:
    series = time_series([record(0.5), record(1.95)], t0=0.0, t1=3.0)
    assert series.t == [0.0, 1.0, 2.0]
    # first: tokens at 0.6, 0.7, 0.8; second: 2.05, 2.15, 2.25
    assert series.output_tokens_per_s == [3.0, 0.0, 3.0]
    assert series.ttft_p50_ms == [100.0, None, 100.0]
