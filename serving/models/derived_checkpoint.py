"""Checkpoints derived from the tiny chat model's files, by bytes: no torch, no training.

The pooling models (`tiny_embedding`, `tiny_reranker`) are the tiny Qwen3's weights in the
form the published Qwen3-Embedding and Qwen3-Reranker checkpoints have. A safetensors file is
an 8-byte header length, a JSON header (tensor name -> dtype, shape, byte offsets) and the raw
tensor bytes, so renaming tensors or copying an embedding row is a rewrite of the header or of
a slice of bytes: the same input files always give the same output bytes, in milliseconds,
and `serving up` need not import torch to build them.

Usage:
    path = ensure_derived(NAME, BUILDER_VERSION, params, write, out=None, force=False)
    tensors = read_safetensors(base / WEIGHTS)
    write_safetensors(out / WEIGHTS, {"norm.weight": tensors["model.norm.weight"]})
    copy_files(base, out, ("config.json", "tokenizer_config.json"))
"""

from __future__ import annotations

import json
import math
import shutil
import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from serving.errors import ServingError
from serving.models.cached_build import (
    Progress,
    cached_build,
    inputs_fingerprint,
    read_build_info,
)
from serving.models.tiny_model import MODEL_NAME as BASE_MODEL
from serving.models.tiny_model import ensure_tiny_model
from serving.paths import models_dir

# Bytes per element of the dtypes our builds write (safetensors' names).
DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "I32": 4}
_HEADER_LENGTH = struct.Struct("<Q")
METADATA_KEY = "__metadata__"
# The tiny chat model's weights file: every derived checkpoint reads it and writes its own.
WEIGHTS = "model.safetensors"
# The chat model's files a derived checkpoint keeps as they are.
UNCHANGED_FILES = ("config.json", "special_tokens_map.json", "tokenizer_config.json")


@dataclass(frozen=True)
class Tensor:
    """One tensor's dtype, shape and raw little-endian bytes (row-major)."""

    dtype: str
    shape: tuple[int, ...]
    data: bytes

    def row_bytes(self) -> int:
        """Bytes of one row (the first dimension's unit)."""
        return DTYPE_BYTES[self.dtype] * math.prod(self.shape[1:])

    def row(self, index: int) -> bytes:
        self._check_row(index)
        size = self.row_bytes()
        return self.data[index * size : (index + 1) * size]

    def with_row(self, index: int, row: bytes) -> Tensor:
        """This tensor with row `index` replaced by `row`."""
        self._check_row(index)
        size = self.row_bytes()
        if len(row) != size:
            raise ServingError(f"a row of {self.shape} has {size} bytes, got {len(row)}")
        data = self.data[: index * size] + row + self.data[(index + 1) * size :]
        return replace(self, data=data)

    def _check_row(self, index: int) -> None:
        if not 0 <= index < self.shape[0]:
            raise ServingError(f"row {index}: outside a tensor of shape {self.shape}")


def read_safetensors(path: Path) -> dict[str, Tensor]:
    """Every tensor of a safetensors file, by name."""
    raw = path.read_bytes()
    (length,) = _HEADER_LENGTH.unpack_from(raw)
    header = json.loads(raw[_HEADER_LENGTH.size : _HEADER_LENGTH.size + length])
    body = raw[_HEADER_LENGTH.size + length :]
    tensors: dict[str, Tensor] = {}
    for name, info in header.items():
        if name == METADATA_KEY:
            continue
        if info["dtype"] not in DTYPE_BYTES:
            raise ServingError(f"{path}: tensor {name} has dtype {info['dtype']}, not one of ours")
        start, end = info["data_offsets"]
        shape = tuple(info["shape"])
        if end - start != DTYPE_BYTES[info["dtype"]] * math.prod(shape):
            raise ServingError(f"{path}: tensor {name}'s offsets do not match its shape")
        tensors[name] = Tensor(info["dtype"], shape, body[start:end])
    return tensors


def write_safetensors(
    path: Path, tensors: Mapping[str, Tensor], metadata: Mapping[str, str] | None = None
) -> None:
    """Write `tensors` in name order, the header padded with spaces to 8 bytes as the
    safetensors library pads it."""
    header: dict[str, object] = {METADATA_KEY: dict(metadata or {"format": "pt"})}
    offset = 0
    for name in sorted(tensors):
        tensor = tensors[name]
        header[name] = {
            "dtype": tensor.dtype,
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + len(tensor.data)],
        }
        offset += len(tensor.data)
    encoded = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
    encoded += b" " * (-len(encoded) % 8)
    with path.open("wb") as handle:
        handle.write(_HEADER_LENGTH.pack(len(encoded)))
        handle.write(encoded)
        for name in sorted(tensors):
            handle.write(tensors[name].data)


def copy_files(source: Path, target: Path, names: Iterable[str]) -> None:
    """Copy these files of `source` into `target` (each must exist)."""
    for name in names:
        if not (source / name).is_file():
            raise ServingError(f"{source} has no {name}: not a build of the tiny model")
        shutil.copyfile(source / name, target / name)


def ensure_derived(
    name: str,
    builder_version: str,
    params: Mapping[str, Any],
    write: Callable[[Path, Path], dict[str, Any]],
    *,
    out: Path | None = None,
    force: bool = False,
    base: Path | None = None,
    progress: Progress | None = None,
) -> Path:
    """Return a dir holding model `name`, written by `write(base_dir, partial_dir)` (which
    returns its record) from the tiny chat model (built first if needed), unless a build of
    the same builder version, parameters and base model is there."""
    report = progress or Progress()
    base_dir = (base or ensure_tiny_model(progress=report)).expanduser().resolve()
    info = read_build_info(base_dir)
    if info is None or "fingerprint" not in info:
        raise ServingError(f"{base_dir} holds no build of {BASE_MODEL} (no build-info.json)")
    fingerprint = inputs_fingerprint(
        builder_version, {**params, "base": str(info["fingerprint"])}, []
    )

    def build(partial: Path) -> dict[str, Any]:
        return {
            "base_fingerprint": info["fingerprint"],
            "builder_version": builder_version,
            "model": name,
            "params": dict(params),
            **write(base_dir, partial),
        }

    target = out or models_dir() / name
    return cached_build(target, fingerprint, build, name=name, progress=report, force=force)
