"""Where the stack's state lives: SERVING_HOME, else the source checkout's var/, else the
per-user cache; the key store every command uses is in it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from serving import paths

REPO = Path(__file__).resolve().parents[1]


def make_checkout(root: Path, name: str = "qwen-serving") -> Path:
    """A directory shaped like a checkout: pyproject.toml naming `name`, and a package dir."""
    (root / "serving").mkdir(parents=True)
    (root / "pyproject.toml").write_text(f'[project]\nname = "{name}"\n', encoding="utf-8")
    return root / "serving"


def test_a_source_checkout_is_recognised_by_its_pyproject(tmp_path: Path) -> None:
    assert paths.source_checkout(make_checkout(tmp_path / "mine")) == tmp_path / "mine"
    assert paths.source_checkout(make_checkout(tmp_path / "other", "other-project")) is None
    site = tmp_path / "site-packages" / "serving"
    site.mkdir(parents=True)
    assert paths.source_checkout(site) is None
    broken = make_checkout(tmp_path / "broken")
    (broken.parent / "pyproject.toml").write_text("[project\n", encoding="utf-8")
    assert paths.source_checkout(broken) is None


def test_this_checkout_keeps_its_state_in_var(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SERVING_HOME", raising=False)
    assert paths.source_checkout() == REPO
    assert paths.serving_home() == REPO / "var"
    assert paths.keys_db_path() == REPO / "var" / "keys.db"
    assert paths.models_dir() == REPO / "var" / "models"


def test_serving_home_wins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SERVING_HOME", str(tmp_path / "home"))
    assert paths.serving_home() == tmp_path / "home"
    assert paths.keys_db_path() == tmp_path / "home" / "keys.db"
    assert paths.dev_api_key_path() == tmp_path / "home" / "dev-api-key"
    assert paths.logs_dir() == tmp_path / "home" / "logs"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SERVING_HOME", "relative")
    assert paths.serving_home() == tmp_path / "relative"


def test_an_installed_copy_uses_the_cache_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("SERVING_HOME", raising=False)
    monkeypatch.setattr(paths, "source_checkout", lambda: None)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert paths.serving_home() == tmp_path / "cache" / "qwen-serving"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    assert paths.keys_db_path() == tmp_path / "user" / ".cache" / "qwen-serving" / "keys.db"


def test_the_checkout_does_not_depend_on_the_current_directory(tmp_path: Path) -> None:
    """`.venv/bin/serving keys` run from anywhere writes the checkout's var/keys.db."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    probe = "from serving import paths; print(paths.keys_db_path())"
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(REPO / "var" / "keys.db")
