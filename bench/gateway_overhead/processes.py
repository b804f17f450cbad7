"""The benchmark's child processes: started pinned to a core, logged to files, always stopped.

    with Launcher(workdir, pin=True) as launcher:
        upstream = launcher.start("upstream", [python, "-m", "..."], cpu=0)
        await launcher.wait_ready("upstream", target, timeout_s=30)
    # every process started here is stopped (SIGINT, SIGTERM, SIGKILL) on the way out

Each child runs in its own session (process group), so the group that was started, and only
that, is signalled at the end. Pinning uses `taskset -c N`; with fewer than two cores (or no
taskset) nothing is pinned and the results say so.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType

from bench.gateway_overhead.load import Target, probe

STOP_TIMEOUT_S = 10.0


class BenchError(Exception):
    """A path could not be set up; the message says which and why."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def can_pin() -> bool:
    return (os.cpu_count() or 1) >= 2 and shutil.which("taskset") is not None


def pin_self(cpu: int) -> None:
    """Pin this process (the load generator) to `cpu`."""
    os.sched_setaffinity(0, {cpu})


class Launcher:
    def __init__(self, workdir: Path, *, pin: bool) -> None:
        self.workdir = workdir
        self.pin = pin
        self._procs: dict[str, subprocess.Popen[bytes]] = {}

    def __enter__(self) -> Launcher:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop_all()

    def log_path(self, name: str) -> Path:
        return self.workdir / f"{name}.log"

    def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        cpu: int,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> subprocess.Popen[bytes]:
        command = [*(("taskset", "-c", str(cpu)) if self.pin else ()), *argv]
        with self.log_path(name).open("wb") as log:
            proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                cwd=cwd,
                start_new_session=True,
            )
        self._procs[name] = proc
        return proc

    def pid(self, name: str) -> int:
        """The process the launcher started for `name` (its group's leader)."""
        return self._procs[name].pid

    def pids(self, name: str) -> tuple[int, ...]:
        """The processes of `name`'s group now: the child and any it started itself."""
        return group_members(self._procs[name].pid)

    def log_tail(self, name: str, lines: int = 15) -> str:
        try:
            text = self.log_path(name).read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    async def wait_ready(self, name: str, target: Target, *, timeout_s: float) -> None:
        """Return once `name` answers a chat completion; `BenchError` if it exits or the
        time runs out."""
        await self.wait_until(name, lambda: probe(target), timeout_s=timeout_s)

    async def wait_until(
        self,
        name: str,
        check: Callable[[], Awaitable[str | None]],
        *,
        timeout_s: float,
    ) -> None:
        """Return once `check()` answers None (ready; else it says why not); `BenchError` if
        `name` exits or the time runs out."""
        proc = self._procs[name]
        deadline = time.monotonic() + timeout_s
        reason = "no answer"
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise BenchError(
                    f"{name} exited with status {proc.returncode}:\n{self.log_tail(name)}"
                )
            try:
                failure = await asyncio.wait_for(check(), timeout=5.0)
            except TimeoutError:
                failure = "probe timed out"
            if failure is None:
                return
            reason = failure
            await asyncio.sleep(0.25)
        raise BenchError(
            f"{name} not ready after {timeout_s:.0f} s ({reason}):\n{self.log_tail(name)}"
        )

    def stop(self, name: str) -> None:
        proc = self._procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        # SIGINT first: servers stop at once on it (the gateway drains for a while on
        # SIGTERM, to let load balancers notice, which a benchmark need not wait for).
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
            _signal_group(proc, signum)
            try:
                proc.wait(timeout=STOP_TIMEOUT_S)
                return
            except subprocess.TimeoutExpired:
                continue

    def stop_all(self) -> None:
        for name in list(self._procs):
            self.stop(name)


def group_members(pgid: int) -> tuple[int, ...]:
    """Ids of the live processes in process group `pgid`."""
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # field 5 of stat: the process group
            members.append(int(entry.name))
    return tuple(members)


def _signal_group(proc: subprocess.Popen[bytes], signum: int) -> None:
    """Signal the process group this launcher started (its id is the child's pid)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signum)
