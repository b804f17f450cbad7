"""`serving engine --dry-run` (docs/profiles.md): the vLLM command a profile starts, printed."""

from __future__ import annotations

import itertools
import shlex
import signal
import subprocess
import sys
import textwrap

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


# A launcher's shape: stop handlers, a run, and a cleanup that takes a while.
STOPPABLE = textwrap.dedent(
    """
    import time
    from serving.engine.command import hold_stop_signals, install_stop_handlers
    install_stop_handlers(lambda name: print("noted", name, flush=True))
    try:
        print("ready", flush=True)
        time.sleep(60)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    finally:
        hold_stop_signals()
        print("cleaning", flush=True)
        time.sleep(1)  # a second signal arrives in here
        print("cleaned", flush=True)
    """
)


@pytest.mark.parametrize("first", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_every_stop_signal_stops_in_order_and_a_second_one_does_not_cut_the_cleanup(
    first: signal.Signals,
) -> None:
    process = subprocess.Popen(
        [sys.executable, "-c", STOPPABLE], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    assert process.stdout.readline() == "ready\n"
    process.send_signal(first)
    assert process.stdout.readline() == f"noted {first.name}\n"  # for the launcher's metrics
    assert process.stdout.readline() == "interrupted\n"
    assert process.stdout.readline() == "cleaning\n"
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=30)
    assert out == "cleaned\n" and process.returncode == 0
    assert f"{first.name} received" in err
    assert "SIGTERM received while stopping: still stopping" in err
