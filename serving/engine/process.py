"""One vLLM server as a child process: start it, wait for `/health`, stop it without orphans.

vLLM starts worker processes (one per tensor-parallel rank, plus its engine core), so the
server runs in its own process group and is stopped as a group: SIGTERM first, SIGKILL for
whatever is left after a grace period.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit

import psutil

from serving.engine.core_affinity import pin_engine_core, spread_binding
from serving.engine.lifeline import with_lifeline
from serving.engine.load_stats import LoadMonitor, LoadStats
from serving.engine.port_check import describe, listener
from serving.errors import ServingError
from serving.vllm_flags import EngineCommand

ProgressFn = Callable[[str], None]
# "RuntimeError: Worker failed with error ..." beats "Worker proc ... died unexpectedly".
EXCEPTION_LINE = re.compile(r"^[A-Za-z_.]*(Error|Exception): ")


def stderr_progress(line: str) -> None:
    """One updating status line on a terminal; plain lines when stderr is not a TTY."""
    if sys.stderr.isatty():
        sys.stderr.write("\r\x1b[2K" + line[:160])
    else:
        sys.stderr.write(line + "\n")
    sys.stderr.flush()


def http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return 200 <= int(response.status) < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


def terminate(process: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM one process (the gateway), SIGKILL it if it has not exited within `grace_s`."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def tail_lines(path: Path, count: int = 15) -> list[str]:
    if not path.exists():
        return []
    with path.open("r", encoding="utf-8", errors="replace") as handle:
        return [line.rstrip("\n") for line in deque(handle, maxlen=count)]


def root_cause(path: Path, scan: int = 400) -> str:
    """The exception vLLM logged last; its tracebacks end in a generic wrapper exception."""
    errors = [
        line.split("] ", 1)[-1].strip() for line in tail_lines(path, scan) if " ERROR " in line
    ]
    exceptions = [line for line in errors if EXCEPTION_LINE.match(line)]
    chosen = exceptions or errors
    return chosen[-1][:300] if chosen else ""


@dataclass(frozen=True)
class Stopped:
    """How a running server stopped: `killed` when SIGTERM did not end every process of its
    group within the grace period and SIGKILL did."""

    killed: bool
    seconds: float


@dataclass
class EngineProcess:
    """A started vLLM server; `base_url` is where its OpenAI API listens."""

    command: EngineCommand
    base_url: str
    log_path: Path
    ranks: int = 1  # tensor-parallel workers: each logs its own weight loading
    # The CPU build: bound apart from other engines' workers, and once healthy its EngineCore
    # moves onto its workers' cores (core_affinity)
    engine_core_on_workers: bool = False
    popen: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    load_stats: LoadStats | None = None  # set once the server is healthy
    _log_handle: IO[bytes] | None = None
    _monitor: LoadMonitor | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_handle = self.log_path.open("ab")
        self._log_handle.write(f"--- starting: {' '.join(self.command.argv)}\n".encode())
        self._log_handle.flush()
        env = self.command.full_env()
        if self.engine_core_on_workers:
            binding = spread_binding(env, self.ranks)
            for name, value in binding.items():  # cores no other engine's worker holds
                self._log_handle.write(f"--- {name}={value}\n".encode())
            env |= binding
        log_offset = self._log_handle.tell()
        self.started_at = time.monotonic()
        self.popen = subprocess.Popen(
            with_lifeline(self.command.argv),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log_handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._monitor = LoadMonitor(
            self.popen.pid,
            self.log_path,
            log_offset,
            ranks=self.ranks,
            started_at=self.started_at,
        )
        self._monitor.start()

    @property
    def pid(self) -> int | None:
        return None if self.popen is None else self.popen.pid

    def exit_code(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    def healthy(self) -> bool:
        return http_ok(f"{self.base_url}/health")

    def wait_healthy(self, timeout: float, progress: ProgressFn | None = None) -> float:
        """Block until `/health` answers 200; returns seconds since start."""
        deadline = time.monotonic() + timeout
        next_report = 0.0
        while time.monotonic() < deadline:
            code = self.exit_code()
            if code is not None:
                last = "\n  ".join(tail_lines(self.log_path))
                cause = root_cause(self.log_path)
                raise ServingError(
                    f"vLLM exited with code {code} before becoming healthy"
                    f"{': ' + cause if cause else ''}; log {self.log_path}:\n  {last}"
                )
            if self.healthy():
                self._check_owner()
                if self.engine_core_on_workers and self.popen is not None:
                    pinned = pin_engine_core(self.popen.pid)
                    if pinned:
                        print(pinned, file=sys.stderr)
                seconds = time.monotonic() - self.started_at
                self.load_stats = self._finish_monitor(seconds)
                return seconds
            waited = time.monotonic() - self.started_at
            if progress is not None and waited >= next_report:
                last_lines = tail_lines(self.log_path, 1)
                hint = last_lines[0][-90:] if last_lines else ""
                progress(f"starting vLLM: {waited:5.1f}s  {hint}")
                # A terminal line is rewritten in place; a log file gets a line per 10 s.
                next_report = waited + (0.5 if sys.stderr.isatty() else 10.0)
            time.sleep(0.5)
        self.stop()
        raise ServingError(
            f"vLLM did not become healthy within {timeout:.0f}s; see {self.log_path}"
        )

    def _check_owner(self) -> None:
        """The server that answered is the one started here, not one left on the port by an
        earlier start (which would be adopted, serving with whatever profile it had)."""
        address = urlsplit(self.base_url)
        pid = None if address.port is None else listener(address.port, address.hostname)
        if pid is None or self.popen is None or pid == self.popen.pid:
            return  # not visible to this user: the start's port check is what holds then
        with contextlib.suppress(psutil.Error):
            if pid in {child.pid for child in psutil.Process(self.popen.pid).children(True)}:
                return
        self.stop()
        raise ServingError(
            f"{self.base_url}/health was answered by {describe(pid)}, not by the vLLM started "
            f"here (PID {self.popen.pid}): stop it first"
        )

    def _finish_monitor(self, seconds: float) -> LoadStats | None:
        monitor, self._monitor = self._monitor, None
        return None if monitor is None else monitor.finish(seconds)

    def stop(self, grace: float = 20.0) -> Stopped | None:
        """SIGTERM the whole process group, SIGKILL what is left after `grace` seconds; how
        it went, or None when the server was not running."""
        self._finish_monitor(0.0)
        if self.popen is None:
            return None
        pgid = self.popen.pid
        running = self.popen.poll() is None
        started = time.monotonic()
        killed = False
        signal_group(pgid, signal.SIGTERM)
        try:
            self.popen.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            killed = True
            signal_group(pgid, signal.SIGKILL)
            self.popen.wait(timeout=10)
        # Workers may outlive the server by a moment; no orphan may survive the stop.
        deadline = time.monotonic() + grace
        while _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _group_alive(pgid):
            killed = True
            signal_group(pgid, signal.SIGKILL)
        stopped = Stopped(killed, time.monotonic() - started) if running else None
        if stopped is not None:  # what an operator reads after a stop: did everything go, how
            how = f"SIGKILL after {grace:g} s" if killed else "SIGTERM"
            print(f"vLLM (PID {pgid}) and its workers stopped by {how} in {stopped.seconds:.1f}s",
                  file=sys.stderr)  # fmt: skip
        if self._log_handle is not None:
            self._log_handle.close()
            self._log_handle = None
        return stopped


def signal_group(pgid: int, signum: signal.Signals) -> None:
    """Signal a process group; one that is gone, or not ours to signal, is left alone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
