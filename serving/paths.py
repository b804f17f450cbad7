"""Where the stack keeps its state: built models, logs, key stores.

`SERVING_HOME` overrides the default `~/.cache/qwen-serving`; the Makefile points it at
`./var` so a checkout keeps everything it makes inside itself.
"""

from __future__ import annotations

import os
from pathlib import Path


def serving_home() -> Path:
    configured = os.environ.get("SERVING_HOME")
    if configured:
        return Path(configured).expanduser().resolve()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "qwen-serving"


def models_dir() -> Path:
    return serving_home() / "models"


def logs_dir() -> Path:
    return serving_home() / "logs"
