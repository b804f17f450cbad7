"""Watch the load generator's own CPU: is it the bottleneck rather than the server?

A Locust process runs its users on one core (gevent). When one of its processes is busy
more than BUSY_PERCENT of a core on average, requests queue inside the load generator,
latencies it reports grow and the throughput it reaches is its own limit. The runner then
warns and the report carries the mark.

It also keeps the tree's cumulative CPU time, so a caller can charge a client the CPU
seconds it used inside a window (the cross-check's CPU per request): on a machine where the
clients share cores with the engine, every CPU second a client spends is one the engine it
measures does not get.

Windows are wall-clock seconds (time.time(), as Locust's records are) or, with
`monotonic=True`, CLOCK_MONOTONIC readings (time.monotonic(), and on Linux time.perf_counter()
in any process, as vLLM's benchmark stamps its requests): those need no conversion between
processes, so a step of the wall clock between two readings cannot move the window. A window
the monitor took no sample inside (its thread was held up the whole time) is not measured:
None, never a made-up 0.

Usage: `with CpuMonitor(pid) as cpu: ...; cpu.summary(); cpu.cpu_seconds((t0, t1))`.
"""

from __future__ import annotations

import itertools
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
    host_mean_percent: float | None  # the whole machine, % of all cores; None: not sampled
    bottleneck: bool
    samples: list[tuple[float, float]]  # (wall clock, busiest process %)
    cpu_seconds: float | None = None  # the whole tree, inside the summary's window


@dataclass
class CpuMonitor:
    pid: int
    interval_s: float = 1.0
    _per_process: dict[int, list[tuple[float, float]]] = field(default_factory=dict)
    _host: list[tuple[float, float]] = field(default_factory=list)
    _busiest: list[tuple[float, float]] = field(default_factory=list)
    _cumulative: list[tuple[float, float]] = field(default_factory=list)
    # The monotonic reading taken with each wall-clock time above (wall -> monotonic).
    _monotonic: dict[float, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._procs: dict[int, psutil.Process] = {}
        # Last CPU seconds seen per process: one that exited keeps what it had used.
        self._used: dict[int, float] = {}
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

    def _account(self, procs: list[psutil.Process], now: float) -> None:
        for proc in procs:
            try:
                times = proc.cpu_times()
            except psutil.NoSuchProcess:
                continue
            self._used[proc.pid] = times.user + times.system
        self._cumulative.append((now, sum(self._used.values())))

    def _now(self) -> float:
        now = time.time()
        self._monotonic[now] = time.monotonic()
        return now

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            busiest, now = 0.0, self._now()
            procs = self._tree()
            for proc in procs:
                try:
                    percent = proc.cpu_percent(None)
                except psutil.NoSuchProcess:
                    continue
                self._per_process.setdefault(proc.pid, []).append((now, percent))
                busiest = max(busiest, percent)
            self._account(procs, now)
            self._host.append((now, psutil.cpu_percent(None)))
            self._busiest.append((now, busiest))

    def __enter__(self) -> CpuMonitor:
        # The first reading before returning, not in the thread: a busy machine once started
        # the thread after the process had sent its first request, and that run's window
        # was not covered (no CPU per request).
        psutil.cpu_percent(None)
        self._account(self._tree(), self._now())
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
        # A last reading, so the samples reach past whatever ended just before (a process
        # that exited keeps the CPU it had used).
        self._account(self._tree(), self._now())

    def cpu_seconds(self, window: tuple[float, float], *, monotonic: bool = False) -> float | None:
        """CPU seconds the tree used from `window[0]` to `window[1]`.

        Linear between samples (a window edge between two samples gets its share of the
        interval); None when the samples do not cover the window or none lies inside it.
        """
        points = self._points(self._cumulative, monotonic)
        if len(points) < 2 or points[0][0] > window[0] or points[-1][0] < window[1]:
            return None
        if not any(window[0] <= t <= window[1] for t, _ in points):
            return None
        return _at(points, window[1]) - _at(points, window[0])

    def summary(
        self, window: tuple[float, float] | None = None, *, monotonic: bool = False
    ) -> CpuSummary:
        """Means over `window`, leaving out Locust's CPU-heavy start-up."""

        def inside(samples: list[tuple[float, float]]) -> list[float]:
            if window is None:
                return [v for _, v in samples]
            return [v for t, v in self._points(samples, monotonic) if window[0] <= t <= window[1]]

        means = [sum(v) / len(v) for v in map(inside, self._per_process.values()) if v]
        worst = max(means, default=0.0)
        host = inside(self._host)
        return CpuSummary(
            processes=len(self._per_process),
            max_mean_percent=worst,
            host_mean_percent=sum(host) / len(host) if host else None,
            bottleneck=worst >= BUSY_PERCENT,
            samples=list(self._busiest),
            cpu_seconds=None if window is None else self.cpu_seconds(window, monotonic=monotonic),
        )

    def _points(
        self, samples: list[tuple[float, float]], monotonic: bool
    ) -> list[tuple[float, float]]:
        points = list(samples)
        if not monotonic:
            return points
        clock = dict(self._monotonic)
        return sorted((clock[t], v) for t, v in points)


def _at(points: list[tuple[float, float]], t: float) -> float:
    """The cumulative value at `t`, interpolated; `points` are (time, value), time-ordered."""
    for (t0, v0), (t1, v1) in itertools.pairwise(points):
        if t0 <= t <= t1:
            return v0 if t1 == t0 else v0 + (v1 - v0) * (t - t0) / (t1 - t0)
    return points[-1][1] if t > points[-1][0] else points[0][1]
