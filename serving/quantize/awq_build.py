"""AWQ checkpoints built on demand and cached, like the tiny model.

`ensure_awq_model(src, out)` quantizes `src` into `out` unless `out` already holds the
quantization of the same source with the same parameters and calibration text (a fingerprint
in build-info.json). The built-in `qwen3-tiny-awq` is the tiny model through this, calibrated
on the shipped corpus.

Usage: `path = ensure_awq_model(Path("Qwen2.5-7B-Instruct"), Path("qwen2.5-7b-awq"))`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from serving.models import tiny_tokenizer as tt
from serving.models.cached_build import Progress, cached_build, read_build_info
from serving.paths import models_dir
from serving.quantize.awq_checkpoint import (
    WEIGHT_FILES,
    AwqParams,
    quantize_checkpoint,
    read_config,
)

# Bump when the quantizer's code changes what it writes; it is part of the fingerprint.
AWQ_BUILDER_VERSION = "2"
TINY_AWQ_NAME = "qwen3-tiny-awq"


def source_identity(src: Path) -> str:
    """What identifies the source: its build fingerprint, else its config and weight files."""
    info = read_build_info(src)
    if info is not None and "fingerprint" in info:
        return f"build:{info['fingerprint']}"
    digest = hashlib.sha256((src / "config.json").read_bytes())
    for pattern in WEIGHT_FILES:
        for path in sorted(src.glob(pattern)):
            stat = path.stat()
            digest.update(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return f"files:{digest.hexdigest()}"


def fingerprint(src: Path, params: AwqParams, texts: Sequence[str]) -> str:
    digest = hashlib.sha256()
    digest.update(f"awq-builder={AWQ_BUILDER_VERSION}\n".encode())
    digest.update(json.dumps(asdict(params), sort_keys=True).encode())
    digest.update(source_identity(src).encode())
    for text in texts:
        digest.update(hashlib.sha256(text.encode()).digest())
    return digest.hexdigest()


def ensure_awq_model(
    src: Path,
    out: Path,
    *,
    params: AwqParams | None = None,
    texts: Sequence[str] | None = None,
    force: bool = False,
    progress: Progress | None = None,
) -> Path:
    """Return `out` holding the AWQ checkpoint of `src`, quantizing first when needed."""
    chosen = params or AwqParams()
    calibration = list(texts) if texts is not None else tt.read_corpus()
    src = src.expanduser().resolve()
    read_config(src)  # fail before taking the lock on a model we cannot quantize
    report = progress or Progress()

    def build(partial: Path) -> dict[str, Any]:
        record = quantize_checkpoint(
            src, partial, chosen, calibration, lambda text: report.status(text, log=False)
        )
        return {"source": str(src), "builder_version": AWQ_BUILDER_VERSION, **record}

    name = f"AWQ of {src.name}"
    key = fingerprint(src, chosen, calibration)
    return cached_build(out, key, build, name=name, progress=report, force=force)


def ensure_tiny_awq_model(progress: Progress | None = None) -> Path:
    """The built-in qwen3-tiny-awq: the tiny model, AWQ 4-bit, group size 128."""
    from serving.models.tiny_model import ensure_tiny_model

    source = ensure_tiny_model(progress=progress)
    return ensure_awq_model(source, models_dir() / TINY_AWQ_NAME, progress=progress)
