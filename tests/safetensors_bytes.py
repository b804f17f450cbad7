"""Bytes of the tensors in safetensors files, read from their headers (checked against sizes)."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "I32": 4, "I8": 1, "U8": 1}


def tensor_bytes(path: Path) -> int:
    """Sum of every tensor's bytes per the safetensors header (the file minus its header)."""
    with path.open("rb") as handle:
        (header_len,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(header_len))
    total = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        assert end - start == DTYPE_BYTES[info["dtype"]] * math.prod(info["shape"])
        total += end - start
    assert total == path.stat().st_size - 8 - header_len
    return total


def model_tensor_bytes(model_dir: Path) -> int:
    """All the tensor bytes of a checkpoint directory."""
    return sum(tensor_bytes(path) for path in model_dir.glob("*.safetensors"))
