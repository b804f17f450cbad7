"""Watch the load generator's own CPU: is it the bottleneck rather than the server?

A Locust process runs its users on one core (gevent). When one of its processes is busy
more than BUSY_PERCENT of a core on average, requests queue inside the load generator,
latencies it reports grow and the throughput it reaches is its own limit. The runner then
warns and the report carries the mark.

Usage: `with CpuMonitor(pid) as cpu: ...; cpu.summary()`.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from types import TracebackType

import psutil

BUSY_PERCENT = 90.0


@dataclass(frozen=True)
class CpuSummary:
    processes: int
    max_mean_percent: float  # the busiest process's mean, % of one core
    host_mean_percent: float  # the whole machine, % of all cores
    bottleneck: bool
    samples: list[tuple[float, float]]  # (wall clock, busiest process %)


@dataclass
class CpuMonitor:
    pid: int
    interval_s: float = 1.0
    _per_process: dict[int, list[tuple[float, float]]] = field(default_factory=dict)
    _host: list[tuple[float, float]] = field(default_factory=list)
    _busiest: list[tuple[float, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._procs: dict[int, psutil.Process] = {}
        self._thread = threading.Thread(target=self._loop, name="cpu-monitor", daemon=True)

    def _tree(self) -> list[psutil.Process]:
        try:
            root = psutil.Process(self.pid)
            found = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []
        for proc in found:
            if proc.pid not in self._procs:
                self._procs[proc.pid] = proc
                proc.cpu_percent(None)  # the first call only sets the baseline
        return [self._procs[p.pid] for p in found]

    def _loop(self) -> None:
        psutil.cpu_percent(None)
        self._tree()
        while not self._stop.wait(self.interval_s):
            busiest, now = 0.0, time.time()
            for proc in self._tree():
                try:
                    percent = proc.cpu_percent(None)
                except psutil.NoSuchProcess:
                    continue
                self._per_process.setdefault(proc.pid, []).append((now, percent))
                busiest = max(busiest, percent)
            self._host.append((now, psutil.cpu_percent(None)))
            self._busiest.append((now, busiest))

    def __enter__(self) -> CpuMonitor:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=self.interval_s + 5)

    def summary(self, window: tuple[float, float] | None = None) -> CpuSummary:
        """Means over `window` (wall clock), leaving out Locust's CPU-heavy start-up."""

        def inside(samples: list[tuple[float, float]]) -> list[float]:
            if window is None:
                return [v for _, v in samples]
            return [v for t, v in samples if window[0] <= t <= window[1]]

        means = [sum(v) / len(v) for v in map(inside, self._per_process.values()) if v]
        worst = max(means, default=0.0)
        host = inside(self._host)
        return CpuSummary(
            processes=len(self._per_process),
            max_mean_percent=worst,
            host_mean_percent=sum(host) / len(host) if host else 0.0,
            bottleneck=worst >= BUSY_PERCENT,
            samples=list(self._busiest),
        )
