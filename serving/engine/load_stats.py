"""How long vLLM took to load its model, and how much host memory loading needed.

While a server starts, a thread samples the proportional set size (PSS) of its whole process
tree (API server, engine core, one worker per rank) every 100 ms. PSS splits shared pages
between the processes that map them, so the sum counts the memory-mapped safetensors and
shared memory once. Sampling stops when every rank has logged vLLM's "Loading weights took"
line: the peak is the memory loading needed, before vLLM allocates its KV cache (which the
planner accounts for separately).

Usage:
    monitor = LoadMonitor(pid, log_path, log_offset, ranks=2, started_at=t0); monitor.start()
    ... once /health answers: stats = monitor.finish(startup_seconds)
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

WEIGHTS_LOADED = re.compile(rb"Loading weights took ([0-9.]+) seconds")


@dataclass(frozen=True)
class LoadStats:
    startup_seconds: float  # process start to /health answering
    load_seconds: float | None  # process start to the last rank's weights loaded
    weights_seconds: float | None  # vLLM's own "Loading weights took", slowest rank
    peak_memory_bytes: int  # peak summed PSS of vLLM's processes until weights were loaded

    def describe(self) -> str:
        parts = [f"healthy after {self.startup_seconds:.1f}s"]
        if self.load_seconds is not None:
            parts.append(f"model loaded after {self.load_seconds:.1f}s")
        if self.weights_seconds is not None:
            parts.append(f"weights read in {self.weights_seconds:.2f}s")
        parts.append(f"peak host memory while loading {self.peak_memory_bytes / 2**30:.2f} GiB")
        return ", ".join(parts)


def tree_memory(pid: int) -> int:
    """Summed PSS (RSS where PSS cannot be read) of a process and its descendants; 0 if gone."""
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for process in processes:
        try:
            total += process.memory_full_info().pss
        except (psutil.AccessDenied, AttributeError):
            total += _rss(process)
        except psutil.Error:
            continue  # exited between listing and reading
    return total


def _rss(process: psutil.Process) -> int:
    try:
        return int(process.memory_info().rss)
    except psutil.Error:
        return 0


class LoadMonitor:
    """Samples a starting server until its ranks report their weights loaded."""

    def __init__(
        self,
        pid: int,
        log_path: Path,
        log_offset: int,
        *,
        ranks: int,
        started_at: float,
        interval: float = 0.1,
    ) -> None:
        self._pid = pid
        self._log_path = log_path
        self._offset = log_offset
        self._ranks = ranks
        self._interval = interval
        self._started = started_at  # time.monotonic() when the server was spawned
        self._peak = 0
        self._weights: list[float] = []
        self._pending = b""  # an unfinished last line of the log
        self._loaded_at: float | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="vllm-load-monitor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._done.is_set():
            self._peak = max(self._peak, tree_memory(self._pid))
            self._pending = self._scan(self._pending)
            if len(self._weights) >= self._ranks:
                self._loaded_at = time.monotonic()
                return
            self._done.wait(self._interval)

    def _scan(self, pending: bytes) -> bytes:
        """Read the log written since the last call; keep an unfinished last line."""
        try:
            with self._log_path.open("rb") as handle:
                handle.seek(self._offset)
                chunk = handle.read()
        except OSError:
            return pending
        self._offset += len(chunk)
        *lines, rest = (pending + chunk).split(b"\n")
        for line in lines:
            match = WEIGHTS_LOADED.search(line)
            if match:
                self._weights.append(float(match.group(1)))
        return rest

    def finish(self, startup_seconds: float) -> LoadStats:
        """Stop sampling (if the load line never came) and report."""
        self._done.set()
        self._thread.join(timeout=5)
        if not self._thread.is_alive() and len(self._weights) < self._ranks:
            # /health can answer between two samples on a busy machine: read what the log
            # got since the last one (the weights line comes before /health in vLLM).
            self._pending = self._scan(self._pending)
        loaded = None if self._loaded_at is None else self._loaded_at - self._started
        return LoadStats(
            startup_seconds=startup_seconds,
            load_seconds=loaded,
            weights_seconds=max(self._weights) if self._weights else None,
            peak_memory_bytes=self._peak,
        )
