"""A child of the launcher dies with it, however the launcher ends (SIGKILL included).

    argv = with_lifeline(argv)     # before Popen: the child is exec'd through this module

`python -m serving.engine.lifeline PID -- PROGRAM ARGS...` asks Linux for a parent-death
signal (SIGTERM, so vLLM and the gateway still shut down in order) and then execs PROGRAM:
the setting survives exec, costs the child nothing while it runs, and needs nothing of
PROGRAM (vLLM is not ours to change). A lifeline pipe would need the child to watch it.
If the launcher (PID) is already gone by then, PROGRAM is never started.

Linux delivers the signal when the *thread* that started the child exits: the launcher starts
each child from the thread that lives as long as it (the main one, or the supervisor's
watcher that restarts an engine and watches it until the stack stops).
Elsewhere (macOS, for development) the argv is left as it is.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def with_lifeline(argv: list[str]) -> list[str]:
    """`argv` exec'd through the lifeline, so the child gets SIGTERM when this process dies."""
    if not sys.platform.startswith("linux"):
        return argv
    return [sys.executable, "-m", __name__, str(os.getpid()), "--", *argv]


def main(args: list[str]) -> int:
    if len(args) < 3 or args[1] != "--" or not args[0].isdigit():
        print("usage: python -m serving.engine.lifeline PARENT_PID -- PROGRAM [ARGS...]")
        return 2
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
        error = ctypes.get_errno()
        print(f"lifeline: prctl(PR_SET_PDEATHSIG) failed: {os.strerror(error)}", file=sys.stderr)
        return 1
    if os.getppid() != int(args[0]):  # the launcher died before the signal was asked for
        return 1
    program = args[2:]
    os.execv(program[0], program)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
