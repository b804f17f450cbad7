from __future__ import annotations

import re
from pathlib import Path

import pytest

from loadtest.config import Tenancy, UserConfig, read_user_config, tenant_key_env, write_user_config
from loadtest.errors import LoadTestError
from loadtest.workload import builtin_workload_names, length_range, load_workload


def test_builtin_workloads_load_and_fit_the_tiny_context() -> None:
    assert builtin_workload_names() == [
        "long-context", "mixed", "shared-prefix", "short-chat", "two-tenant",
    ]  # fmt: skip
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


def test_tenants_split_the_users_by_weight_and_name_their_keys() -> None:
    tenants = load_workload("two-tenant").tenants()
    assert tenants == {
        "quiet": Tenancy(scenarios=("quiet-chat",), share=0.25),
        "noisy": Tenancy(scenarios=("noisy-long",), share=0.75, bursts=(10.0, 10.0)),
    }
    assert load_workload("short-chat").tenants().keys() == {""}
    assert tenant_key_env("noisy") == "LOADTEST_API_KEY_NOISY"
    assert tenant_key_env("team-a") == "LOADTEST_API_KEY_TEAM_A"
    assert tenant_key_env("") == "LOADTEST_API_KEY"


def test_a_bursty_tenant_sends_only_in_its_on_phases() -> None:
    bursty = Tenancy(scenarios=("a",), share=1.0, bursts=(10.0, 5.0))
    assert [bursty.sends_at(t) for t in (0, 9.5, 10, 12, 15, 24.9)] == [0, 0, 5, 3, 0, 0]
    assert Tenancy(scenarios=("a",), share=1.0).sends_at(123.0) == 0


def test_tenants_travel_to_the_locust_processes(tmp_path: Path) -> None:
    tenants = load_workload("two-tenant").tenants()
    config = UserConfig(model="m", prompts_path="p", records_dir="r", tenants=tenants)
    write_user_config(config, tmp_path / "config.json")
    assert read_user_config(str(tmp_path / "config.json")) == config


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("    bursts: [0, 5]\n", "need on_s > 0"),
        ("    tenant: Team A\n", "scenarios.0.tenant"),
    ],
)
def test_bad_tenants_name_the_field(tmp_path: Path, extra: str, message: str) -> None:
    path = tmp_path / "w.yaml"
    path.write_text(
        "scenarios:\n  - name: a\n    prompt_tokens: 10\n    output_tokens: 5\n" + extra
    )
    with pytest.raises(LoadTestError, match=re.escape(message)):
        load_workload(str(path))


def test_one_tenant_has_one_burst_pattern(tmp_path: Path) -> None:
    path = tmp_path / "w.yaml"
    path.write_text(
        "scenarios:\n"
        "  - {name: a, tenant: t, prompt_tokens: 10, output_tokens: 5, bursts: [1, 1]}\n"
        "  - {name: b, tenant: t, prompt_tokens: 10, output_tokens: 5}\n"
    )
    with pytest.raises(LoadTestError, match="tenant 't': its scenarios must share one bursts"):
        load_workload(str(path))
