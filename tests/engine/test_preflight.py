import pytest

from serving.engine.preflight import plan_profile, preflight
from serving.errors import ServingError
from serving.profiles import load_all_profiles
from serving.profiles.loader import parse_profile

GPU_PROFILES = [p for p in load_all_profiles() if p.device == "gpu"]


@pytest.mark.parametrize("profile", GPU_PROFILES, ids=lambda p: p.name)
def test_every_shipped_gpu_profile_fits(profile: object) -> None:
    from serving.profiles import Profile

    assert isinstance(profile, Profile)
    plan = preflight(profile, profile.model)
    assert plan is not None and plan.fits
    assert plan.max_sequences >= 1


def test_a_profile_that_cannot_fit_is_refused_with_the_reason_and_a_fix() -> None:
    profile = parse_profile(
        {"device": "gpu", "gpu": "rtx-4090", "model": "Qwen/Qwen2.5-7B-Instruct",
         "served_model_name": "x", "max_model_len": 32768, "dtype": "float16",
         "gpu_memory_utilization": 0.5},
        source="x.yaml", default_name="too-big",
    )  # fmt: skip
    with pytest.raises(ServingError) as excinfo:
        preflight(profile, profile.model)
    message = str(excinfo.value)
    assert "too-big does not fit" in message and "weights" in message
    assert "cheapest fix" in message and "\n" not in message


def test_an_unknown_model_is_started_unchecked_with_a_warning() -> None:
    profile = parse_profile(
        {"device": "gpu", "gpu": "h100", "model": "someone/custom-model",
         "served_model_name": "x", "max_model_len": 4096},
        source="x.yaml", default_name="custom",
    )  # fmt: skip
    warnings: list[str] = []
    assert preflight(profile, profile.model, warn=warnings.append) is None
    assert plan_profile(profile, profile.model) is None
    assert warnings and "not checked" in warnings[0]
