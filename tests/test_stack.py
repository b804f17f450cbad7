"""`serving up`'s gateway settings for images come from the served model's files and the
profile (the engine side of the same numbers); its slots and priority from the profile; its
metrics port (every key's series) is open by default, on no other server's port."""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
from pathlib import Path

import pytest

from serving.errors import ServingError
from serving.gateway.settings import GatewaySettings
from serving.ports import ENGINE_PORT, GATEWAY_METRICS_PORT, GATEWAY_PORT
from serving.profiles import load_profile
from serving.profiles.model import Profile
from serving.stack import (
    DEFAULT_PROFILE,
    add_arguments,
    banner,
    check_gateway_metrics_port,
    gateway_image_settings,
)
from serving.stack_engines import gateway_engine_settings


def profile(model: str, **fields: object) -> Profile:
    return Profile.model_validate(
        {"name": "p", "device": "cpu", "model": model, "served_model_name": "m",
         "max_model_len": 1024, **fields}
    )  # fmt: skip


def test_a_local_vision_model_passes_its_rule_and_the_profile_limit(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(
        json.dumps({"vision_config": {"patch_size": 14, "spatial_merge_size": 2}})
    )
    (tmp_path / "preprocessor_config.json").write_text(
        json.dumps({"min_pixels": 784, "max_pixels": 50176})
    )
    settings = gateway_image_settings(profile(str(tmp_path), limit_mm_per_prompt={"image": 3}))
    assert settings == {
        "max_images_per_request": 3,
        "image_patch_size": 14,
        "image_merge_size": 2,
        "image_min_pixels": 784,
        "image_max_pixels": 50176,
    }


def test_a_local_text_model_refuses_images(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    assert gateway_image_settings(profile(str(tmp_path))) == {"max_images_per_request": 0}


def test_a_hub_model_not_in_the_cache_keeps_the_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    hub = profile("Qwen/Qwen2.5-VL-7B-Instruct", limit_mm_per_prompt={"image": 2})
    assert gateway_image_settings(hub) == {"max_images_per_request": 2}
    assert gateway_image_settings(profile("Qwen/Qwen2.5-VL-7B-Instruct")) == {}


@pytest.mark.parametrize(("name", "priority"), [("cpu-tiny", False), ("cpu-tiny-lora", True)])
def test_the_gateway_sends_priorities_exactly_when_the_engine_orders_by_them(
    name: str, priority: bool
) -> None:
    shipped = load_profile(name)
    settings = gateway_engine_settings(shipped, "fair")
    assert settings["engine_slots"] == shipped.max_num_seqs
    assert settings["stream_interval"] == shipped.stream_interval == 8  # as cpu-tiny's
    assert (shipped.scheduling_policy == "priority") is priority
    loaded = GatewaySettings.create(upstream="http://127.0.0.1:1", api_keys=["k"], **settings)
    assert loaded.engine_priority is priority


def stack_ports(replicas: int) -> tuple[list[int], list[int]]:
    """The engines' and launchers' ports `serving up --replicas N` takes by default."""
    engines = [ENGINE_PORT + 2 * replica for replica in range(replicas)]
    return engines, [port + 1 for port in engines]


def test_serving_up_opens_the_gateway_metrics_port_by_default() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args([]).gateway_metrics_port == GATEWAY_METRICS_PORT
    # no collision with the most engines --replicas allows, nor with the ephemeral ports
    # (Linux's 32768+) the tests' free_port() hands out
    check_gateway_metrics_port(GATEWAY_METRICS_PORT, GATEWAY_PORT, *stack_ports(16))
    assert GATEWAY_METRICS_PORT < 32768


@pytest.mark.parametrize(
    ("port", "taken"),
    [
        (GATEWAY_PORT, "the gateway's"),
        (ENGINE_PORT + 2 * 3, "an engine's"),
        (ENGINE_PORT + 2 * 3 + 1, "an engine launcher's"),
        (0, "not a port number"),
    ],
)
def test_a_gateway_metrics_port_another_server_takes_is_refused_before_any_starts(
    port: int, taken: str
) -> None:
    with pytest.raises(ServingError, match=f"--gateway-metrics-port {port}.*{taken}"):
        check_gateway_metrics_port(port, GATEWAY_PORT, *stack_ports(4))


def test_profile_repeats_and_defaults_to_the_chat_model() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args([]).profile is None  # run() serves DEFAULT_PROFILE
    chosen = parser.parse_args(["--profile", "cpu-tiny", "--profile", "cpu-tiny-embedding"])
    assert chosen.profile == ["cpu-tiny", "cpu-tiny-embedding"]
    assert DEFAULT_PROFILE == "cpu-tiny"


def test_make_up_serves_the_pooling_profiles_beside_the_chat_model() -> None:
    """The Makefile's `up` recipe, printed by `make -n` as make would run it, parses into
    the chat profile followed by every POOLING profile."""
    printed = subprocess.run(
        ["make", "-n", "up", 'POOLING=cpu-tiny-embedding cpu-tiny-reranker', "PORT=1",
         "ENGINE_PORT=2", "GATEWAY_METRICS_PORT=3"],
        cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, check=True,
    ).stdout.replace("\\\n", " ")  # fmt: skip
    line = next(line for line in printed.splitlines() if " up --profile" in line)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(shlex.split(line.split(" up ", 1)[1]))
    assert args.profile == ["cpu-tiny", "cpu-tiny-embedding", "cpu-tiny-reranker"]
    assert (args.port, args.engine_port, args.gateway_metrics_port) == (1, 2, 3)


def test_the_banner_shows_a_chat_example_only_when_a_model_chats() -> None:
    def shown(model: str, pooling: tuple[str, ...]) -> str:
        return banner("http://g", model, "k", 1.0, "p", metrics_url="http://m", pooling=pooling)

    both = shown("qwen3-tiny", ("qwen3-tiny-embedding",))
    assert "Serving qwen3-tiny, qwen3-tiny-embedding (profile p)" in both
    assert "pooling models (embeddings, scores): qwen3-tiny-embedding" in both
    assert 'model="qwen3-tiny"' in both
    pooling_only = shown("", ("qwen3-tiny-embedding",))
    assert "Serving qwen3-tiny-embedding (profile p)" in pooling_only
    assert "chat.completions" not in pooling_only
    assert "pooling models" not in shown("qwen3-tiny", ())
