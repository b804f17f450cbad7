"""The Locust command line the runner builds, and what the cross-check asks of it."""

from __future__ import annotations

from pathlib import Path

import pytest

import loadtest.crosscheck
from loadtest.plan import Plan
from loadtest.runner import LocustRun, locust_command
from loadtest.targets import Targets
from loadtest.workload import load_workload


def spawn_rate(run: LocustRun) -> float:
    command = locust_command(run)
    return float(command[command.index("--spawn-rate") + 1])


def test_users_start_within_one_second_unless_told_otherwise(tmp_path: Path) -> None:
    run = LocustRun(host="http://x/", model="m", prompts_path=tmp_path, out=tmp_path, users=8)
    assert spawn_rate(run) == 8
    assert spawn_rate(LocustRun(host="h", model="m", prompts_path=tmp_path, out=tmp_path)) == 1


class Handed(Exception):
    """Stops the round once the runner has been handed its LocustRun."""


def test_the_crosschecks_users_start_together_as_vllms_first_requests_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    handed: list[LocustRun] = []

    def capture(run: LocustRun) -> None:
        handed.append(run)
        raise Handed

    monkeypatch.setattr(loadtest.crosscheck, "run_locust", capture)
    plan = Plan(
        workload=load_workload("short-chat"), model="m", max_model_len=2048, tokenizer="t",
        prompts_path=tmp_path, targets=Targets(), targets_source="none",
    )  # fmt: skip
    with pytest.raises(Handed):
        loadtest.crosscheck.our_round(
            plan, base_url="http://h", prompts=tmp_path, out=tmp_path, concurrency=4,
            num_prompts=16, api_key=None, position=1, index=1,
        )  # fmt: skip
    run = handed[0]
    assert (run.users, run.max_requests, run.ordered, run.itl_events) == (4, 16, True, False)
    # 4 users 10 ms apart, not 250 ms (the default); Locust itself warns above 100 a second.
    assert spawn_rate(run) == 100
