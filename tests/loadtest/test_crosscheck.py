"""Cross-check verdicts: medians of interleaved rounds, each side's spread, and the reasons."""

from __future__ import annotations

import pytest

from loadtest.crosscheck import ENGINE_E2E, ENGINE_TTFT, engine_view, round_order
from loadtest.crosscheck_verdict import RoundResult, Spread, judge
from loadtest.scraper import PREFIX_HITS


def rounds(
    ours: list[tuple[float, float]],
    vllm: list[tuple[float, float]],
    *,
    cpu: tuple[float, float] = (1.5, 1.5),
    failed: int = 0,
) -> list[RoundResult]:
    """Rounds from (output tok/s, mean TTFT ms) pairs, interleaved as the cross-check runs them."""
    values = {"ours": ours, "vllm": vllm}
    made = []
    for position, (client, index) in enumerate(round_order(len(ours)), start=1):
        throughput, ttft = values[client][index - 1]
        made.append(
            RoundResult(
                client=client, index=index, position=position, completed=128, failed=failed,
                duration_s=10.0, output_tokens_per_s=throughput, mean_ttft_ms=ttft,
                mean_tpot_ms=5.0, cpu_ms_per_request=cpu[0] if client == "ours" else cpu[1],
                host_cpu_percent=100.0, prefix_cache_hits=0.0,
            )
        )  # fmt: skip
    return made


def test_rounds_alternate_who_goes_first() -> None:
    assert [c for c, _ in round_order(3)] == ["ours", "vllm", "vllm", "ours", "ours", "vllm"]
    assert sorted(i for c, i in round_order(3) if c == "vllm") == [1, 2, 3]


def test_spread_is_the_range_over_the_median() -> None:
    spread = Spread.of([90.0, 100.0, 110.0])
    assert (spread.median, spread.low, spread.high) == (100.0, 90.0, 110.0)
    assert abs(spread.relative - 0.2) < 1e-9  # three rounds: every one counts


def test_from_four_rounds_the_spread_leaves_out_the_extremes() -> None:
    spread = Spread.of([100.0, 60.0, 99.0, 101.0, 150.0])
    assert (spread.median, spread.low, spread.high) == (100.0, 60.0, 150.0)
    assert (spread.mid_low, spread.mid_high) == (99.0, 101.0)
    assert abs(spread.relative - 0.02) < 1e-9
    assert (Spread.of([98.0, 150.0, 102.0, 10.0]).mid_low, Spread.of([98.0, 102.0]).mid_low) == (
        98.0,
        98.0,
    )


def test_one_round_in_five_moved_by_the_machine_cannot_make_it_inconclusive_two_can() -> None:
    quiet: list[tuple[float, float]] = [(600, 100), (596, 103), (610, 104), (604, 101)]
    vllm: list[tuple[float, float]] = [(590, 98), (605, 101), (595, 103), (600, 100), (602, 99)]
    one = judge(rounds([*quiet, (300, 400)], vllm))
    assert one.label == "AGREE" and "lowest, highest left out" in one.table()
    two = judge(rounds([*quiet[:3], (300, 400), (310, 390)], vllm))
    assert two.noisy and two.label.startswith("INCONCLUSIVE")


def test_quiet_rounds_with_close_medians_agree() -> None:
    verdict = judge(
        rounds([(600, 100), (596, 103), (610, 104)], [(590, 98), (605, 101), (595, 103)])
    )
    assert verdict.agree and verdict.label == "AGREE" and not verdict.reasons
    throughput = verdict.comparisons[0]
    assert throughput.metric == "output tokens/s" and abs(throughput.ratio - 600 / 595) < 1e-9
    assert "verdict: AGREE" in verdict.table()


def test_close_medians_of_wild_rounds_are_inconclusive_not_agreement() -> None:
    verdict = judge(
        rounds([(600, 100), (100, 900), (610, 104)], [(590, 98), (605, 101), (595, 103)])
    )
    assert verdict.agree and verdict.noisy  # medians inside the tolerance, by chance
    assert verdict.label.startswith("INCONCLUSIVE")
    assert any("ours's own rounds spread" in r and "within the tolerance by chance" in r
               for r in verdict.reasons)  # fmt: skip


def test_a_gap_with_quiet_rounds_is_a_real_difference() -> None:
    verdict = judge(
        rounds([(500, 100), (505, 101), (498, 99)], [(600, 100), (602, 100), (598, 101)])
    )
    assert not verdict.agree and not verdict.noisy and verdict.label == "DIFFER"
    assert len(verdict.reasons) == 1 and "no known cause" in verdict.reasons[0]
    assert "output tokens/s ours 500.00 vs 600.00" in verdict.reasons[0]


def test_ttft_medians_a_few_ms_apart_agree_however_short_the_ttft() -> None:
    # A quiet run of the tiny engine: 27 ms against 33 ms is 19% but 6 ms of client work.
    close = judge(rounds([(677, 27.0), (680, 26.5), (675, 27.5)], [(676, 33.3)] * 3))
    assert close.agree and close.label == "AGREE"
    far = judge(rounds([(677, 20.0), (680, 20.5), (675, 19.5)], [(676, 33.3)] * 3))
    assert not far.agree and "DIFFERS (>10% and >10)" in far.table()
    # At hundreds of ms the floor is inside the 10%: the ratio decides alone.
    assert not judge(rounds([(677, 280.0)] * 3, [(676, 333.0)] * 3)).agree


def test_a_gap_inside_one_sides_own_spread_blames_the_machine() -> None:
    verdict = judge(
        rounds([(600, 100), (600, 100), (600, 100)], [(500, 100), (700, 100), (720, 100)])
    )
    assert not verdict.agree and verdict.label.startswith("INCONCLUSIVE")
    assert "vllm bench's own rounds spread 31%" in verdict.reasons[0]
    assert "outside the tolerance by chance" in verdict.reasons[0]
    assert "quieter machine" in verdict.reasons[0]
    assert "DIFFERS (>10%), noisy" in verdict.table()


def test_failures_are_named_and_client_cpu_is_charged() -> None:
    same = [(600.0, 100.0)] * 3
    verdict = judge(rounds(same, [(700, 100)] * 3, cpu=(3.0, 2.0), failed=1), tolerance=0.05)
    assert any("failed requests: ours 3, vllm bench 3" in r for r in verdict.reasons)
    # 1 ms more per request at 12.8 requests/s: 1.3% of a core.
    note = next(n for n in verdict.notes if "more CPU per request" in n)
    assert "1.00 ms more" in note and "(1.50x)" in note and "1.3% of one core" in note
    cpu = next(c for c in verdict.comparisons if c.metric == "client CPU ms/request")
    assert not cpu.judged and "shown" in verdict.table()


def test_the_engines_own_view_of_a_round() -> None:
    before = {
        PREFIX_HITS: 10.0,
        f"{ENGINE_TTFT}_sum": 1.0,
        f"{ENGINE_TTFT}_count": 10.0,
        f"{ENGINE_E2E}_sum": 5.0,
        f"{ENGINE_E2E}_count": 10.0,
    }
    after = {
        PREFIX_HITS: 10.0,
        f"{ENGINE_TTFT}_sum": 13.8,
        f"{ENGINE_TTFT}_count": 138.0,
        f"{ENGINE_E2E}_sum": 69.0,
        f"{ENGINE_E2E}_count": 138.0,
    }
    view = engine_view(before, after)
    assert view["prefix_cache_hits"] == 0
    assert view["engine_ttft_ms"] == pytest.approx(100.0)
    assert view["engine_e2e_ms"] == pytest.approx(500.0)
    assert engine_view({}, {}) == {
        "prefix_cache_hits": None,
        "engine_ttft_ms": None,
        "engine_e2e_ms": None,
    }
