from __future__ import annotations

import re
from pathlib import Path

import pytest

from loadtest.errors import LoadTestError
from loadtest.workload import builtin_workload_names, length_range, load_workload


def test_builtin_workloads_load_and_fit_the_tiny_context() -> None:
    assert builtin_workload_names() == ["long-context", "mixed", "shared-prefix", "short-chat"]
    for name in builtin_workload_names():
        workload = load_workload(name)
        for scenario in workload.scenarios:
            low, high = scenario.prompt_range(2048)
            assert 1 <= low <= high <= 2048 - scenario.output_range()[1]


def test_lengths_fixed_ranged_and_relative_to_context() -> None:
    assert length_range(64, 2048, "x") == (64, 64)
    assert length_range([32, 128], 2048, "x") == (32, 128)
    assert length_range(["50%", "90%"], 2000, "x") == (1000, 1800)
    long = load_workload("long-context").scenarios[0]
    assert long.prompt_range(2048) == (1536, 1843)
    assert long.prompt_range(32768)[1] == 29491


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ([64, 32], "need 1 <= low <= high"),
        ("lots", "expected an integer or a percentage"),
        ([1, 2, 3], "a range is [low, high]"),
    ],
)
def test_bad_lengths_name_the_field(spec: object, message: str) -> None:
    with pytest.raises(
        LoadTestError, match=re.escape(f"chat.prompt_tokens={spec!r}: ") + ".*" + re.escape(message)
    ):
        length_range(spec, 2048, "chat.prompt_tokens")  # type: ignore[arg-type]


def test_bad_workload_file_names_file_and_field(tmp_path: Path) -> None:
    path = tmp_path / "w.yaml"
    path.write_text(
        "scenarios:\n  - name: a\n    prompt_tokens: 10\n    output_tokens: 5\n    colour: red\n"
    )
    with pytest.raises(LoadTestError, match=r"w\.yaml: field 'scenarios\.0\.colour'"):
        load_workload(str(path))
    with pytest.raises(LoadTestError, match="unknown workload 'nope'"):
        load_workload("nope")


def test_prompt_too_long_for_the_context_is_refused() -> None:
    scenario = load_workload("shared-prefix").scenarios[0]
    with pytest.raises(LoadTestError, match="exceed max_model_len 512"):
        scenario.prompt_range(512)
