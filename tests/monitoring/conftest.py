from __future__ import annotations

import shutil
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def promtool() -> Path:
    """Debian's promtool; its absence fails the tests (`make test` installs it)."""
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool not found: `make system-deps` installs Debian's prometheus package")
    return Path(path)
