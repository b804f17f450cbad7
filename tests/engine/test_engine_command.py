"""`serving engine --dry-run` (docs/profiles.md): the vLLM command a profile starts, printed."""

from __future__ import annotations

import itertools
import shlex

import pytest

from serving.cli import main


def test_dry_run_prints_the_vllm_command_and_starts_nothing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["engine", "--profile", "cpu-tiny", "--dry-run"]) == 0
    printed = capsys.readouterr().out.strip()
    words = shlex.split(printed)
    assert words.index("-m") + 1 == words.index("vllm.entrypoints.openai.api_server")
    flags = dict(itertools.pairwise(words))
    assert flags["--port"] == "8001" and flags["--host"] == "127.0.0.1"
    assert flags["--served-model-name"] == "qwen3-tiny"
    assert flags["--max-num-seqs"] == "16"
    assert "\n" not in printed  # one line, to paste into a shell
