"""A profile's plan: what the engine's preflight, the k8s sizing and `serving plan` share."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import serving.cli as cli
from serving.errors import ServingError
from serving.paths import HOME_ENV
from serving.planner import plan_to_dict
from serving.planner.profile_plan import (
    DEFAULT_GPU,
    default_gpu,
    profile_gpu,
    profile_model_ref,
    profile_plan,
    profile_settings,
)
from serving.profiles import load_profile


# The profiles docs/planner.md, docs/profiles.md and docs/anthropic.md plan, an AWQ one and
# one on two nodes.
@pytest.mark.parametrize(
    "name",
    [
        "qwen2.5-7b-fp16-tp4-4090",
        "qwen2.5-7b-awq-4090",
        "qwen2.5-72b-pp2-tp4-2x4090x4",
        "qwen3-coder-30b-a3b-h100",
    ],
)
def test_profile_plan_is_what_serving_plan_prints_for_the_profile(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["plan", "--profile", name, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == plan_to_dict(profile_plan(load_profile(name)))


def test_settings_carry_the_profiles_engine_settings_and_count_every_gpu() -> None:
    profile = load_profile("qwen2.5-72b-pp2-tp4-2x4090x4")
    settings = profile_settings(profile)
    assert settings.gpu_count == profile.gpu_count * profile.nodes == 8
    assert settings.gpus_per_node == profile.gpu_count
    assert settings.max_model_len == profile.max_model_len
    assert settings.tensor_parallel_size == 4 and settings.pipeline_parallel_size == 2


def test_gpus_and_the_default() -> None:
    assert profile_gpu(load_profile("cpu-tiny")).name == "cpu"
    assert profile_gpu(load_profile("qwen2.5-7b-awq-4090")).name == "rtx-4090"
    assert default_gpu().name == DEFAULT_GPU


def test_a_builtin_model_not_built_yet_is_named_with_how_to_build_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(HOME_ENV, str(tmp_path))
    profile = load_profile("cpu-tiny")
    with pytest.raises(ServingError, match=r"not built yet.*serving model"):
        profile_model_ref(profile)
    assert profile_model_ref(load_profile("qwen2.5-7b-awq-4090")) == "Qwen/Qwen2.5-7B-Instruct-AWQ"
    # Planned from its build parameters, so the plan needs no checkpoint.
    assert profile_plan(profile).fits


def test_the_coder_profile_plans_as_its_docs_say() -> None:
    # docs/planner.md and docs/profiles.md quote these numbers.
    profile = load_profile("qwen3-coder-30b-a3b-h100")
    plan = profile_plan(profile)
    assert plan.fits and profile_gpu(profile).name == "h100-80gb"
    assert plan.model == "Qwen3-Coder-30B-A3B-Instruct" and plan.weights.total == 61_064_245_248
    assert f"{plan.weights.total / 2**30:.2f} {plan.kv_available_bytes / 2**30:.2f}" == (
        "56.87 14.61"
    )
    assert plan.capacity.tokens == 159_536 > profile.max_model_len == 131_072
    assert (profile.tool_call_parser, profile.reasoning_parser) == ("qwen3_coder", None)
