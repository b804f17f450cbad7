"""For tests of how settings are read: a clean environment and settings from flags.

from tests.gateway.settings_env import clean_environment, from_flags  # noqa: F401
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from serving import cli
from serving.gateway.command import settings_from_args
from serving.gateway.setting_names import ENV_PREFIX
from serving.gateway.settings import GatewaySettings


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """No SERVING_GATEWAY_* or SERVING_API_KEY from the caller; a serving home of our own."""
    for name in list(os.environ):
        if name.startswith(ENV_PREFIX) or name == "SERVING_API_KEY":
            monkeypatch.delenv(name)
    monkeypatch.setenv("SERVING_HOME", str(tmp_path / "home"))
    yield


def from_flags(*argv: str) -> GatewaySettings:
    """Settings as `serving gateway ARGV` builds them."""
    return settings_from_args(cli.build_parser().parse_args(["gateway", *argv]))
