import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from serving.engine.preflight import plan_profile, preflight, process_env
from serving.engine.visible_gpus import OVERRIDE_ENV, VisibleGpus
from serving.errors import ServingError
from serving.profiles import load_all_profiles
from serving.profiles.loader import parse_profile

GPU_PROFILES = [p for p in load_all_profiles() if p.device == "gpu"]


def eight_gpus(env: object) -> VisibleGpus:
    """A host big enough for every profile: these tests are about memory, not this machine."""
    return VisibleGpus(8, "test")


@pytest.mark.parametrize("profile", GPU_PROFILES, ids=lambda p: p.name)
def test_every_shipped_gpu_profile_fits(profile: object, tmp_path: Path) -> None:
    from serving.profiles import Profile

    assert isinstance(profile, Profile)
    env = {"HF_HOME": str(tmp_path)}
    plan = preflight(profile, profile.model, lambda _: None, env=env, gpus=eight_gpus)
    assert plan is not None and plan.fits
    assert plan.max_sequences >= 1


def test_a_profile_that_cannot_fit_is_refused_with_the_reason_and_a_fix(tmp_path: Path) -> None:
    profile = parse_profile(
        {"device": "gpu", "gpu": "rtx-4090", "model": "Qwen/Qwen2.5-7B-Instruct",
         "served_model_name": "x", "max_model_len": 32768, "dtype": "float16",
         "gpu_memory_utilization": 0.5},
        source="x.yaml", default_name="too-big",
    )  # fmt: skip
    with pytest.raises(ServingError) as excinfo:
        preflight(profile, profile.model, env={"HF_HOME": str(tmp_path)}, gpus=eight_gpus)
    message = str(excinfo.value)
    assert "too-big does not fit" in message and "weights" in message
    assert "cheapest fix" in message and "\n" not in message


def test_an_unknown_model_is_started_unchecked_with_a_warning(tmp_path: Path) -> None:
    profile = parse_profile(
        {"device": "gpu", "gpu": "h100", "model": "someone/custom-model",
         "served_model_name": "x", "max_model_len": 4096},
        source="x.yaml", default_name="custom",
    )  # fmt: skip
    warnings: list[str] = []
    env = {"HF_HOME": str(tmp_path)}
    assert preflight(profile, profile.model, warnings.append, env=env, gpus=eight_gpus) is None
    assert plan_profile(profile, profile.model) is None
    assert warnings and "not checked" in warnings[-1]


# --- this host: GPUs first, then weights (tests/engine/test_visible_gpus.py, test_hf_cache.py
# cover the counting and the cache layout) ---

TP4 = {"device": "gpu", "gpu": "rtx-4090", "gpu_count": 4, "tensor_parallel_size": 4,
       "model": "Qwen/Qwen3.5-9B", "served_model_name": "x", "max_model_len": 4096}  # fmt: skip


def gpus(count: int) -> Callable[[Mapping[str, str]], VisibleGpus]:
    return lambda env: VisibleGpus(count, "fake count")


def no_gpu_question(env: Mapping[str, str]) -> VisibleGpus:
    raise AssertionError("a CPU profile must not count GPUs")


def cache_snapshot(cache: Path, repo_id: str) -> Path:
    snapshot = cache / ("models--" + repo_id.replace("/", "--")) / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (snapshot / "model.safetensors").write_bytes(b"x")
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("abc123")
    return snapshot


def test_a_gpu_profile_on_a_host_with_too_few_gpus_is_refused_at_once(tmp_path: Path) -> None:
    profile = parse_profile(TP4, source="x.yaml", default_name="big-tp4")
    # Offline with nothing cached as well: the GPU count is what this user must hear first.
    env = {"HF_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    with pytest.raises(ServingError) as excinfo:
        preflight(profile, profile.model, env=env, gpus=gpus(1))
    message = str(excinfo.value)
    assert "profile big-tp4 wants 4 GPUs" in message and "1 is visible" in message
    assert "fake count" in message and "\n" not in message


def test_enough_gpus_pass_the_gpu_check(tmp_path: Path) -> None:
    profile = parse_profile(TP4, source="x.yaml", default_name="big-tp4")
    notes: list[str] = []
    preflight(profile, profile.model, notes.append, env={"HF_HOME": str(tmp_path)}, gpus=gpus(4))
    assert not any("GPU" in note for note in notes)


def test_cpu_profiles_never_count_gpus(tmp_path: Path) -> None:
    profile = next(p for p in load_all_profiles() if p.name == "cpu-tiny-tp2")
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    preflight(profile, str(model_dir), lambda _: None, env={}, gpus=no_gpu_question)


def test_offline_without_cached_weights_is_refused_naming_where_it_looked(tmp_path: Path) -> None:
    profile = parse_profile(TP4, source="x.yaml", default_name="big-tp4")
    env = {"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    with pytest.raises(ServingError) as excinfo:
        preflight(profile, profile.model, env=env, gpus=gpus(4))
    message = str(excinfo.value)
    assert "Qwen/Qwen3.5-9B are not in the local Hugging Face cache" in message
    assert str(tmp_path / "hub" / "models--Qwen--Qwen3.5-9B") in message
    assert "HF_HUB_OFFLINE" in message and "\n" not in message


def test_online_without_cached_weights_only_notes_the_download(tmp_path: Path) -> None:
    profile = parse_profile(TP4, source="x.yaml", default_name="big-tp4")
    notes: list[str] = []
    preflight(profile, profile.model, notes.append, env={"HF_HOME": str(tmp_path)}, gpus=gpus(4))
    assert any("not in the local cache" in note and "vLLM will download" in note for note in notes)


def test_offline_with_cached_weights_starts(tmp_path: Path) -> None:
    profile = parse_profile(TP4, source="x.yaml", default_name="big-tp4")
    cache_snapshot(tmp_path / "hf" / "hub", profile.model)
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    notes: list[str] = []
    preflight(profile, profile.model, notes.append, env=env, gpus=gpus(4))
    assert not any("cache" in note for note in notes)


def test_a_local_model_directory_is_not_looked_up_in_the_hub_cache(tmp_path: Path) -> None:
    model_dir = tmp_path / "Qwen" / "Qwen3.5-9B"
    model_dir.mkdir(parents=True)
    profile = parse_profile({**TP4, "model": str(model_dir)}, source="x.yaml", default_name="l")
    env = {"HF_HOME": str(tmp_path / "empty"), "HF_HUB_OFFLINE": "1"}
    preflight(profile, str(model_dir), lambda _: None, env=env, gpus=gpus(4))


def test_the_engine_environment_is_what_the_checks_read(monkeypatch: pytest.MonkeyPatch) -> None:
    # A profile's env reaches vLLM over the launcher's, so it must win here too.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    profile = parse_profile(
        {**TP4, "env": {"CUDA_VISIBLE_DEVICES": "0", "HF_HUB_OFFLINE": "1"}},
        source="x.yaml", default_name="masked",
    )  # fmt: skip
    env = process_env(profile)
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and env["HF_HUB_OFFLINE"] == "1"


def serving_command() -> list[str]:
    """The installed console script beside this interpreter, as users run it."""
    script = Path(sys.executable).with_name("serving")
    return [str(script)] if script.exists() else [sys.executable, "-m", "serving.cli"]


def test_serving_up_on_a_host_without_gpus_fails_at_once_with_one_line(tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if key != OVERRIDE_ENV}
    # CUDA_VISIBLE_DEVICES="" hides every GPU, so this holds on a GPU machine too; offline
    # and an empty cache make sure nothing could be downloaded if the check regressed.
    env |= {"SERVING_HOME": str(tmp_path / "home"), "HF_HOME": str(tmp_path / "hf"),
            "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}  # fmt: skip
    started = time.monotonic()
    result = subprocess.run(
        [*serving_command(), "up", "--profile", "qwen3.5-9b-128k-tp4"],
        env=env,
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    assert result.returncode != 0
    assert time.monotonic() - started < 20
    assert "profile qwen3.5-9b-128k-tp4 wants 4 GPUs" in result.stderr
    assert "0 are visible" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
