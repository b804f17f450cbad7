"""Finding a hub checkpoint in the local Hugging Face cache by its directory layout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from serving.engine.hf_cache import cached_checkpoint, hub_cache_dir, hub_offline, is_hub_name

REPO = "Qwen/Qwen3-8B"


def snapshot_dir(cache: Path, *, commit: str = "abc123", ref: bool = True) -> Path:
    repo = cache / "models--Qwen--Qwen3-8B"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    if ref:
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(commit + "\n")
    (snapshot / "config.json").write_text("{}")
    return snapshot


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"HF_HUB_CACHE": "/a", "HUGGINGFACE_HUB_CACHE": "/b", "HF_HOME": "/c"}, "/a"),
        ({"HUGGINGFACE_HUB_CACHE": "/b", "HF_HOME": "/c"}, "/b"),
        ({"HF_HOME": "/c", "XDG_CACHE_HOME": "/x"}, "/c/hub"),
        ({"XDG_CACHE_HOME": "/x"}, "/x/huggingface/hub"),
    ],
)
def test_the_cache_directory_follows_huggingface_hub(env: dict[str, str], expected: str) -> None:
    assert hub_cache_dir(env) == Path(expected)


def test_the_default_cache_is_under_the_home_directory() -> None:
    assert hub_cache_dir({}) == Path.home() / ".cache" / "huggingface" / "hub"


@pytest.mark.parametrize(
    ("env", "offline"),
    [
        ({}, False),
        ({"HF_HUB_OFFLINE": "1"}, True),
        ({"HF_HUB_OFFLINE": "true"}, True),
        ({"HF_HUB_OFFLINE": "0"}, False),
        ({"TRANSFORMERS_OFFLINE": "yes"}, True),
    ],
)
def test_offline_mode_reads_the_same_variables(env: dict[str, str], offline: bool) -> None:
    assert hub_offline(env) is offline


@pytest.mark.parametrize(
    ("model", "hub"),
    [
        ("Qwen/Qwen3.5-9B", True),
        ("gpt2", True),
        ("/models/qwen", False),
        ("./qwen", False),
        ("~/qwen", False),
        ("a/b/c", False),
        ("builtin:qwen3-tiny", False),
        ("org/../x", False),
    ],
)
def test_hub_names_are_told_from_paths(model: str, hub: bool) -> None:
    assert is_hub_name(model) is hub


def test_a_complete_snapshot_at_main_is_found(tmp_path: Path) -> None:
    snapshot = snapshot_dir(tmp_path)
    (snapshot / "model.safetensors").write_bytes(b"x")
    assert cached_checkpoint(REPO, tmp_path) == snapshot


def test_nothing_cached_is_none(tmp_path: Path) -> None:
    assert cached_checkpoint(REPO, tmp_path) is None
    assert cached_checkpoint(REPO, tmp_path / "absent") is None


def test_a_snapshot_without_weights_is_not_enough(tmp_path: Path) -> None:
    snapshot_dir(tmp_path)  # config only: a `hf download --include config.json` leaves this
    assert cached_checkpoint(REPO, tmp_path) is None


def test_a_snapshot_not_at_main_is_not_what_vllm_would_load(tmp_path: Path) -> None:
    snapshot = snapshot_dir(tmp_path, ref=False)
    (snapshot / "model.safetensors").write_bytes(b"x")
    assert cached_checkpoint(REPO, tmp_path) is None


def test_a_dangling_blob_link_is_missing(tmp_path: Path) -> None:
    snapshot = snapshot_dir(tmp_path)
    (snapshot / "model.safetensors").symlink_to(tmp_path / "blobs" / "gone")
    assert cached_checkpoint(REPO, tmp_path) is None


def test_a_sharded_checkpoint_needs_every_shard_its_index_names(tmp_path: Path) -> None:
    snapshot = snapshot_dir(tmp_path)
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    index = {"weight_map": {"a.weight": shards[0], "b.weight": shards[1]}}
    (snapshot / "model.safetensors.index.json").write_text(json.dumps(index))
    (snapshot / shards[0]).write_bytes(b"x")
    assert cached_checkpoint(REPO, tmp_path) is None  # an interrupted download
    (snapshot / shards[1]).write_bytes(b"x")
    assert cached_checkpoint(REPO, tmp_path) == snapshot


def test_an_unreadable_index_is_not_a_complete_checkpoint(tmp_path: Path) -> None:
    snapshot = snapshot_dir(tmp_path)
    (snapshot / "model.safetensors.index.json").write_text("not json")
    (snapshot / "model.safetensors").write_bytes(b"x")
    assert cached_checkpoint(REPO, tmp_path) is None
