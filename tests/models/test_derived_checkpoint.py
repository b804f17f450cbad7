"""Safetensors by bytes: what we write the safetensors library reads back tensor for tensor,
a row copy changes that row only, and a derived build is cached against its base's build."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from serving.errors import ServingError
from serving.models.cached_build import Progress, read_build_info
from serving.models.derived_checkpoint import (
    copy_files,
    ensure_derived,
    read_safetensors,
    write_safetensors,
)

QUIET = Progress(quiet=True)


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    tensors = {
        "model.embed_tokens.weight": torch.randn(6, 4).to(torch.bfloat16),
        "model.norm.weight": torch.randn(4, dtype=torch.float32),
        "counts": torch.arange(5, dtype=torch.int32),
    }
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    return path


def test_written_tensors_read_back_equal_in_the_safetensors_library(
    checkpoint: Path, tmp_path: Path
) -> None:
    out = tmp_path / "copy.safetensors"
    write_safetensors(out, read_safetensors(checkpoint))
    original, copied = load_file(str(checkpoint)), load_file(str(out))
    assert original.keys() == copied.keys()
    for name, tensor in original.items():
        assert copied[name].dtype == tensor.dtype and torch.equal(copied[name], tensor), name
    (length,) = struct.unpack("<Q", out.read_bytes()[:8])
    assert length % 8 == 0  # padded as the library pads it


def test_a_row_copy_changes_that_row_only(checkpoint: Path, tmp_path: Path) -> None:
    embedding = read_safetensors(checkpoint)["model.embed_tokens.weight"]
    assert embedding.row_bytes() == 4 * 2
    copied = embedding.with_row(5, embedding.row(1))
    out = tmp_path / "rows.safetensors"
    write_safetensors(out, {"e": copied})
    before = load_file(str(checkpoint))["model.embed_tokens.weight"]
    after = load_file(str(out))["e"]
    assert torch.equal(after[5], before[1])
    assert torch.equal(after[:5], before[:5])
    with pytest.raises(ServingError, match="row 6: outside"):
        embedding.row(6)
    with pytest.raises(ServingError, match="has 8 bytes, got 2"):
        embedding.with_row(0, b"ab")


def test_a_dtype_not_ours_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "f64.safetensors"
    save_file({"x": torch.zeros(2, dtype=torch.float64)}, str(path))
    with pytest.raises(ServingError, match="dtype F64"):
        read_safetensors(path)


def test_missing_base_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(ServingError, match=r"has no config\.json"):
        copy_files(tmp_path, tmp_path, ("config.json",))


def fake_base(directory: Path, fingerprint: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "build-info.json").write_text(json.dumps({"fingerprint": fingerprint}))
    return directory


def test_a_derived_build_is_reused_until_its_base_or_parameters_change(tmp_path: Path) -> None:
    writes: list[Path] = []

    def write(base: Path, out: Path) -> dict[str, Any]:
        writes.append(base)
        (out / "model.txt").write_text(base.name)
        return {"written": True}

    base = fake_base(tmp_path / "base", "one")
    out = tmp_path / "derived"

    def build(params: dict[str, str], base_dir: Path) -> Path:
        return ensure_derived("d", "1", params, write, out=out, base=base_dir, progress=QUIET)

    assert build({"a": "x"}, base) == out.resolve()
    info = read_build_info(out)
    assert info is not None
    assert (info["model"], info["base_fingerprint"], info["written"]) == ("d", "one", True)
    build({"a": "x"}, base)
    assert len(writes) == 1  # cached
    build({"a": "y"}, base)
    build({"a": "y"}, fake_base(tmp_path / "base", "two"))
    assert len(writes) == 3


def test_a_base_that_is_not_a_build_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ServingError, match=r"no build-info\.json"):
        ensure_derived(
            "d", "1", {}, lambda base, out: {}, out=tmp_path / "o", base=tmp_path, progress=QUIET
        )
