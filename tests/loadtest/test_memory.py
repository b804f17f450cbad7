"""The memory-plan mode: sizing from the planner, the verdict, and a ramp against the fake.

The fake upstream simulates a paged KV cache (requests wait while their blocks do not fit),
so the ramp, its conditions, the per-step analysis and the report run for real here; the
integration test holds the same mode against vLLM itself.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadtest.cli import main
from loadtest.errors import LoadTestError
from loadtest.memory import Measured, Step, measure, verdict
from loadtest.memory_plan import default_levels, predict, size_sequence
from tests.loadtest.conftest import API_KEY
from tests.loadtest.fake_upstream import FakeConfig, RunningFake, serve_fake

PROFILE = "cpu-tiny-smallkv"


def test_sizing_puts_the_prompt_into_the_last_block_and_the_output_inside_it() -> None:
    sizing = size_sequence(128, 1024)
    assert (sizing.blocks, sizing.prompt_tokens, sizing.output_tokens) == (8, 904, 112)
    assert sizing.output_min == 56  # outputs vary, so requests do not end in lock-step
    assert size_sequence(128, 1024, output=100).output_min == 100
    # The prompt generator may miss its length by a token or two either way.
    assert all(sizing.holds_its_blocks(n) for n in range(902, 907))
    assert not sizing.holds_its_blocks(896)  # one block fewer at admission
    assert not sizing.holds_its_blocks(914)  # decode would need a ninth block
    assert size_sequence(16, 4096, blocks=4).prompt_tokens == 52


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"blocks": 9}, "blocks-per-sequence"), ({"output": 120}, "output-tokens")],
)
def test_sizing_refuses_what_cannot_hold_exact_blocks(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(LoadTestError, match=message):
        size_sequence(128, 1024, **kwargs)


def test_the_small_kv_profile_fits_four_sequences_by_the_planners_numbers() -> None:
    p = predict(PROFILE)
    assert (p.num_blocks, p.fit.usable_blocks, p.fit.blocks_per_sequence) == (10, 9, 2)
    assert (p.sizing.prompt_tokens, p.sizing.output_min, p.sizing.output_tokens) == (520, 248, 496)
    assert (p.sequences, p.waiting_from, p.binding) == (4, 5, "KV cache")
    assert p.plateau_usage == pytest.approx(8 / 9)
    assert [p.usage_at(u) for u in (1, 4, 6)] == pytest.approx([2 / 9, 8 / 9, 8 / 9])
    assert default_levels(p.sequences) == [1, 2, 3, 4, 5, 6]
    assert default_levels(32) == [8, 16, 24, 31, 32, 33, 34]


def step(users: int, *, waiting: float, kv: float, preemptions: float = 0) -> Step:
    return Step(
        users=users, seconds=5, scrapes=10, kv_usage=kv, kv_usage_max=kv, running=users,
        waiting=waiting, waiting_max=waiting, waiting_share=1.0 if waiting else 0.0,
        blocks_per_sequence=2, preemptions=preemptions, engine_tokens_per_s=1,
        client_tokens_per_s=1, requests=users, failed=0, predicted_running=users,
        predicted_waiting=0, predicted_usage=kv, predicted_blocks_per_sequence=2,
    )  # fmt: skip


def test_verdict_holds_the_waiting_point_and_the_plateau_to_their_tolerances() -> None:
    p = predict(PROFILE)
    agreeing = Measured(
        waiting_from=5, preempting_from=None, saturated_from=5, sequences=4,
        plateau_usage=8 / 9, plateau_median=8 / 9, usage_max=8 / 9, failed=0,
    )  # fmt: skip
    assert verdict(p, agreeing, top_level=6).passed
    off_by_one = Measured(4, None, 4, 3, 8 / 9 * 1.04, 6 / 9, 8 / 9 * 1.04, 0)
    assert verdict(p, off_by_one, top_level=6).passed
    early = Measured(3, None, 3, 2, 4 / 9, 4 / 9, 4 / 9, 0)
    checks = verdict(p, early, top_level=6).checks
    assert [c.passed for c in checks] == [False, False, True, True]
    over = Measured(5, None, 5, 5, 10 / 9, 10 / 9, 10 / 9, 0)
    assert [c.passed for c in verdict(p, over, top_level=6).checks] == [True, False, False, True]
    never = Measured(None, None, None, 6, None, None, 6 / 9, 0)
    assert "none up to 6 users" in verdict(p, never, top_level=6).checks[0].measured


def test_preemption_counts_as_the_point_where_requests_start_waiting() -> None:
    steps = [step(1, waiting=0, kv=0.2), step(2, waiting=0, kv=0.9, preemptions=3)]
    steps.append(step(3, waiting=1, kv=0.9))
    measured = measure(steps, [], [])
    assert (measured.waiting_from, measured.preempting_from, measured.saturated_from) == (3, 2, 2)


@pytest.fixture
def paged_fake() -> Iterator[RunningFake]:
    """A cache of 10 blocks, 2 a request: 4 run at once, like the profile's plan."""
    config = FakeConfig(ttft_s=0.05, itl_s=0.001, api_key=API_KEY, kv_blocks=10,
                        blocks_per_request=2)  # fmt: skip
    with serve_fake(config) as running:
        yield running


def memory(fake: RunningFake, tokenizer_dir: Path, out: Path, *extra: str) -> int:
    return main([
        "memory", "--profile", PROFILE, "--host", fake.url, "--api-key", API_KEY,
        "--engine-metrics", f"{fake.url}/metrics", "--tokenizer", str(tokenizer_dir),
        "--scrape-interval", "0.2", "--min-scrapes", "4", "--step-timeout", "60",
        "--out", str(out), *extra,
    ])  # fmt: skip


def test_a_ramp_on_a_cache_that_matches_the_plan_agrees(
    paged_fake: RunningFake, tokenizer_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert memory(paged_fake, tokenizer_dir, tmp_path) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["verdict"]["passed"] is True
    assert report["engine_blocks"] == 10
    steps = report["steps"]
    assert [s["users"] for s in steps] == [1, 2, 3, 4, 5, 6]
    assert [s["running"] for s in steps] == [1, 2, 3, 4, 4, 4]
    assert [s["waiting"] for s in steps] == [0, 0, 0, 0, 1, 2]
    assert report["measured"]["waiting_from"] == 5
    assert report["measured"]["plateau_usage"] == pytest.approx(8 / 9)
    assert all(s["blocks_per_sequence"] == pytest.approx(2) for s in steps)
    assert all(s["client_tokens_per_s"] > 0 and s["failed"] == 0 for s in steps)
    # Every request asked for exactly the planned sequence (prompt sized by the tokenizer).
    bodies = paged_fake.state.bodies
    assert all(248 <= b["max_tokens"] <= 496 and b["ignore_eos"] for b in bodies)
    html = (tmp_path / "report.html").read_text()
    assert 'id="plan"' in html and 'id="steps"' in html and html.count("<svg") == 4
    assert (tmp_path / "run" / "report.html").is_file()
    out = capsys.readouterr().out
    assert "| users |" in out and "verdict: PASS" in out


def test_a_cache_smaller_than_planned_fails_the_verdict(
    tokenizer_dir: Path, tmp_path: Path
) -> None:
    config = FakeConfig(ttft_s=0.05, itl_s=0.001, api_key=API_KEY, kv_blocks=5,
                        blocks_per_request=2)  # fmt: skip
    with serve_fake(config) as fake:
        code = memory(fake, tokenizer_dir, tmp_path, "--levels", "1,2,3,4")
    assert code == 1
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["measured"]["waiting_from"] == 3
    assert [c["passed"] for c in report["verdict"]["checks"]] == [False, False, False, True]
    assert any("allocated 5 KV blocks, the plan 10" in w for w in report["warnings"])
