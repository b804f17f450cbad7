"""A profile's LoRA adapters on the way to vLLM: resolved (built-ins built on demand), checked
before start, and passed to vLLM's --lora-modules by `serving engine`."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from serving.cli import main
from serving.engine import launch, resolve
from serving.engine.preflight import check_adapters, preflight
from serving.engine.resolve import resolve_adapters
from serving.errors import ServingError
from serving.profiles import load_profile
from serving.profiles.loader import parse_profile


def lora_profile(*adapters: dict[str, Any]) -> Any:
    data = {
        "device": "cpu",
        "model": "builtin:qwen3-tiny",
        "served_model_name": "qwen3-tiny",
        "max_model_len": 64,
        "lora": {"max_lora_rank": 16, "adapters": list(adapters)},
    }
    return parse_profile(data, source="x.yaml", default_name="x")


def peft_dir(path: Path, rank: int) -> Path:
    path.mkdir()
    (path / "adapter_config.json").write_text(json.dumps({"r": rank, "peft_type": "LORA"}))
    return path


def test_each_kind_of_adapter_path_resolves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(resolve.BUILTIN_ADAPTERS, "qwen3-tiny-lora", lambda: tmp_path / "built")
    monkeypatch.chdir(tmp_path)
    peft_dir(tmp_path / "local", 8)
    profile = lora_profile(
        {"name": "a", "path": "builtin:qwen3-tiny-lora", "rank": 8},
        {"name": "b", "path": "local", "rank": 8},
        {"name": "c", "path": "someone/qwen3-lora", "rank": 16},
    )
    assert resolve_adapters(profile) == {
        "a": str(tmp_path / "built"),
        "b": str(tmp_path / "local"),  # absolute: vLLM runs in another directory
        "c": "someone/qwen3-lora",
    }
    assert resolve_adapters(load_profile("cpu-tiny")) == {}


def test_an_unknown_builtin_adapter_names_its_field() -> None:
    profile = lora_profile({"name": "a", "path": "builtin:nope", "rank": 8})
    with pytest.raises(ServingError) as excinfo:
        resolve_adapters(profile)
    message = str(excinfo.value)
    assert "field 'lora.adapters.0.path': unknown builtin 'nope'" in message
    assert "qwen3-tiny-lora" in message


def test_preflight_refuses_a_rank_the_files_contradict(tmp_path: Path) -> None:
    profile = lora_profile({"name": "a", "path": str(tmp_path / "a"), "rank": 8})
    peft_dir(tmp_path / "a", 16)
    with pytest.raises(ServingError, match=r"adapter a: .*adapter_config.json says r=16, the prof"):
        check_adapters(profile, {}, {})
    (tmp_path / "a" / "adapter_config.json").write_text('{"r": 8}')
    check_adapters(profile, {}, {})


def test_preflight_refuses_an_uncached_hub_adapter_offline(tmp_path: Path) -> None:
    profile = lora_profile({"name": "a", "path": "someone/qwen3-lora", "rank": 8})
    env = {"HF_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    with pytest.raises(ServingError, match="someone/qwen3-lora are not in the local"):
        preflight(profile, str(tmp_path), lambda _: None, env=env, adapters={})


def test_serving_engine_passes_the_resolved_adapters_to_vllm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, Any] = {}

    def checked(profile: Any, model: str, **kwargs: Any) -> None:
        seen.update(kwargs)

    monkeypatch.setattr(launch, "resolve_model", lambda profile: "/models/qwen3-tiny")
    monkeypatch.setattr(launch, "resolve_adapters", lambda profile: {"team-a": "/models/lora"})
    monkeypatch.setattr(launch, "preflight", checked)
    supervisor = launch.build_supervisor(
        load_profile("cpu-tiny-lora"), host="127.0.0.1", port=8001, log_file=str(tmp_path / "l")
    )
    argv = supervisor.make_process().command.argv
    assert argv[argv.index("--lora-modules") + 1 :] == ["team-a=/models/lora"]
    assert {"--enable-lora", "--max-loras", "--max-lora-rank"} <= set(argv)
    assert seen["adapters"] == {"team-a": "/models/lora"}


def test_dry_run_shows_the_adapters_as_the_profile_writes_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["engine", "--profile", "cpu-tiny-lora", "--dry-run"]) == 0  # builds nothing
    words = shlex.split(capsys.readouterr().out)
    assert words[words.index("--lora-modules") + 1] == "team-a=builtin:qwen3-tiny-lora"
    assert words[words.index("--max-loras") + 1] == "2"
