"""A child started through the lifeline dies with the launcher, SIGKILL included."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from serving.engine.lifeline import main, with_lifeline

# A launcher that starts a long sleeper through the lifeline and prints the sleeper's PID.
LAUNCHER = textwrap.dedent(
    """
    import subprocess, sys, time
    from serving.engine.lifeline import with_lifeline
    child = subprocess.Popen(with_lifeline([sys.executable, "-c", "import time; time.sleep(120)"]))
    print(child.pid, flush=True)
    time.sleep(120)
    """
)


def test_the_child_gets_sigterm_when_its_launcher_is_killed() -> None:
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE, text=True)
    assert launcher.stdout is not None
    child = psutil.Process(int(launcher.stdout.readline()))
    try:
        # the exec happened: the lifeline became the program (same PID)
        assert _eventually_execd(child)
        assert child.is_running()
        launcher.kill()
        launcher.wait(10)
        _, alive = psutil.wait_procs([child], timeout=20)
        assert not alive, "the child outlived its launcher"
    finally:
        if launcher.poll() is None:
            launcher.kill()
        if child.is_running():
            child.kill()


def _eventually_execd(child: psutil.Process, budget_s: float = 20) -> bool:
    deadline = time.monotonic() + budget_s
    while time.monotonic() < deadline:
        if "serving.engine.lifeline" not in " ".join(child.cmdline()):
            return True
        time.sleep(0.05)
    return False


def test_nothing_starts_when_the_launcher_is_already_gone(
    capsys: pytest.CaptureFixture[str],
) -> None:
    not_my_parent = os.getpid()  # this process is not its own parent
    assert main([str(not_my_parent), "--", "/bin/false-never-run"]) == 1


def test_a_malformed_command_line_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--", "prog"]) == 2
    assert "usage" in capsys.readouterr().out


def test_the_program_is_exec_d_with_its_own_argv() -> None:
    argv = with_lifeline(["/usr/bin/env", "true"])
    assert argv[:3] == [sys.executable, "-m", "serving.engine.lifeline"]
    assert argv[3:] == [str(os.getpid()), "--", "/usr/bin/env", "true"]
    assert subprocess.run(argv, timeout=30).returncode == 0
