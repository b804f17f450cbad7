"""Whether a hub checkpoint is already in the local Hugging Face cache, without the network.

vLLM offline (HF_HUB_OFFLINE=1) with a checkpoint that is not cached retries and fails only
after its whole start-up; reading the cache's directory layout answers in microseconds. The
layout is huggingface_hub's documented one (`models--ORG--NAME/refs/main` holds the commit,
`snapshots/COMMIT/` the files), read here directly so the check needs no vLLM install, and the
cache directory follows the same variables in the same order as huggingface_hub.

Usage: `cached_checkpoint("Qwen/Qwen3-8B", hub_cache_dir(env))` -> snapshot dir or None.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path

# huggingface_hub's ENV_VARS_TRUE_VALUES.
_TRUE = {"1", "ON", "YES", "TRUE"}
# "name" or "org/name" with the hub's allowed characters; paths ("./x", "/x", "a/b/c") fail.
_REPO_ID = re.compile(r"^(?:[A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*$")
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
_SHARD_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def _expand(value: str) -> Path:
    return Path(os.path.expandvars(value)).expanduser()


def hub_cache_dir(env: Mapping[str, str]) -> Path:
    """HF_HUB_CACHE, else the legacy HUGGINGFACE_HUB_CACHE, else HF_HOME/hub (HF_HOME defaults
    to $XDG_CACHE_HOME/huggingface, then ~/.cache/huggingface)."""
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(name):
            return _expand(env[name])
    home = env.get("HF_HOME") or str(
        Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface"
    )
    return _expand(home) / "hub"


def hub_offline(env: Mapping[str, str]) -> bool:
    """True where huggingface_hub (and so vLLM) will not download anything."""
    value = env.get("HF_HUB_OFFLINE") or env.get("TRANSFORMERS_OFFLINE") or ""
    return value.upper() in _TRUE


def is_hub_name(model: str) -> bool:
    """A hub repository id such as `Qwen/Qwen3-8B` (not a path that happens not to exist)."""
    return _REPO_ID.match(model) is not None and ".." not in model and "--" not in model


def repo_cache_dir(repo_id: str, cache: Path) -> Path:
    return cache / ("models--" + repo_id.replace("/", "--"))


def _complete(snapshot: Path) -> bool:
    """config.json plus weights; every shard a sharded checkpoint's index names."""
    if not (snapshot / "config.json").is_file():
        return False
    for index in _SHARD_INDEXES:
        if (snapshot / index).is_file():
            try:
                shards = set(json.loads((snapshot / index).read_text())["weight_map"].values())
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                return False
            return all((snapshot / str(shard)).is_file() for shard in shards)
    # is_file follows the snapshot's symlinks into blobs/, so a dangling link is missing.
    return any(p.suffix in _WEIGHT_SUFFIXES and p.is_file() for p in snapshot.iterdir())


def cached_checkpoint(repo_id: str, cache: Path) -> Path | None:
    """The cached snapshot of `repo_id` at `main`, or None if it is absent or incomplete.

    Only `main` counts: that is the revision vLLM asks for, and offline huggingface_hub
    resolves it through refs/main alone.
    """
    repo = repo_cache_dir(repo_id, cache)
    try:
        commit = (repo / "refs" / "main").read_text(encoding="utf-8").strip()
        snapshot = repo / "snapshots" / commit
        return snapshot if commit and _complete(snapshot) else None
    except OSError:
        return None
