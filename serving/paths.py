"""Where the stack keeps its state: built models, logs, the key store, the development key.

    serving_home()   # $SERVING_HOME if set; else <checkout>/var when running from a source
                     # checkout; else $XDG_CACHE_HOME/qwen-serving (~/.cache/qwen-serving)
    keys_db_path()   # serving_home() / "keys.db": `serving keys`, `serving gateway`, `serving up`

This module is the one place that decides it. A source checkout is recognised by this package's
parent directory holding this project's pyproject.toml (an editable install, `make up`), so
`.venv/bin/serving keys create` run in a checkout writes the same `./var/keys.db` that the
gateway started by `make up` reads, whatever the current directory. An installed wheel has no
pyproject.toml beside it and uses the per-user cache directory.
"""

from __future__ import annotations

import functools
import os
import tomllib
from pathlib import Path

HOME_ENV = "SERVING_HOME"
PROJECT_NAME = "qwen-serving"
_PACKAGE_DIR = Path(__file__).resolve().parent


def serving_home() -> Path:
    """The directory that holds everything the stack builds and records (not created here)."""
    configured = os.environ.get(HOME_ENV)
    if configured:
        return Path(configured).expanduser().resolve()
    checkout = source_checkout()
    if checkout is not None:
        return checkout / "var"
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / PROJECT_NAME


@functools.cache
def source_checkout(package_dir: Path = _PACKAGE_DIR) -> Path | None:
    """The checkout `package_dir` (default: this package) was imported from, or None when it
    is an installed copy: the parent directory must hold this project's pyproject.toml."""
    root = package_dir.parent
    try:
        project = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
    section = project.get("project")
    name = section.get("name") if isinstance(section, dict) else None
    return root if name == PROJECT_NAME else None


def keys_db_path() -> Path:
    """The embedded key store (SQLite): written by `serving keys`, read by the gateway."""
    return serving_home() / "keys.db"


def dev_api_key_path() -> Path:
    """Where `serving up` keeps the development key it generated (mode 0600)."""
    return serving_home() / "dev-api-key"


# A profile's `model: builtin:NAME` is the model `serving model` builds in models_dir()/NAME.
BUILTIN_PREFIX = "builtin:"


def models_dir() -> Path:
    return serving_home() / "models"


def logs_dir() -> Path:
    return serving_home() / "logs"
