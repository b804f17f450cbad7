"""LiteLLM's throwaway venv on a fresh clone, where `bench/.venvs/` does not exist yet.

Nothing is installed and nothing is faked: the real set-up runs with a venv path that
`python -m venv` cannot use (a file), so it stops at its first step, after the log is opened.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.gateway_overhead.litellm_proxy import LiteLLMUnavailable, ensure_installed


def test_install_log_directory_is_created_on_a_fresh_clone(tmp_path: Path) -> None:
    log = tmp_path / "bench" / ".venvs" / "litellm-install.log"  # git-ignored: absent
    not_a_directory = tmp_path / "litellm"
    not_a_directory.write_text("")

    with pytest.raises(LiteLLMUnavailable) as failed:
        ensure_installed(not_a_directory, log=log)

    message = str(failed.value)
    assert "venv" in message and "failed with status" in message
    assert f"(full log: {log})" in message
    assert "Not a directory" in log.read_text()
