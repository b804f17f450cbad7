from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from loadtest.cpu import CpuMonitor


def used(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def watch(code: str) -> tuple[float, float]:
    """The monitor's mean % of a core for a process, and what the kernel says it used."""
    process = subprocess.Popen([sys.executable, "-c", code])
    try:
        time.sleep(0.5)  # past the interpreter's start-up
        with CpuMonitor(process.pid, interval_s=0.25) as monitor:
            before, started = used(process.pid), time.monotonic()
            time.sleep(2.0)
            truth = (used(process.pid) - before) / (time.monotonic() - started) * 100
    finally:
        process.kill()
        process.wait()
    summary = monitor.summary()
    assert summary.processes == 1 and summary.samples
    return summary.max_mean_percent, truth


def test_the_monitor_reports_the_share_of_a_core_the_process_got() -> None:
    # What a spinning process gets depends on what else runs (on the busy 2-core machine,
    # as little as 15%), so the monitor is held to the kernel's own accounting.
    busy, truth = watch("while True: pass")
    assert abs(busy - truth) < 15 and busy > 1, (busy, truth)
    idle, _ = watch("import time; time.sleep(30)")
    assert idle < 1 < busy


def test_cpu_seconds_in_a_window_are_what_the_process_used_then() -> None:
    # Spins until it used a CPU second (however long a busy machine takes), then sleeps.
    code = "import time\nwhile time.process_time() < 1.0: pass\ntime.sleep(60)"
    process = subprocess.Popen([sys.executable, "-c", code])
    try:
        with CpuMonitor(process.pid, interval_s=0.1) as monitor:
            time.sleep(0.3)
            first = (time.time(), used(process.pid))
            while used(process.pid) < 0.95:  # the kernel counts in 10 ms ticks
                assert time.time() < first[0] + 100, "the spin never got its CPU"
                time.sleep(0.05)
            spun = time.time()
            time.sleep(1.5)
            last = (time.time(), used(process.pid))
    finally:
        process.kill()
        process.wait()
    charged = monitor.cpu_seconds((first[0], last[0]))
    # Readings of the kernel's counters a few ms off the window's edges: 0.1 s of slack.
    assert charged is not None and abs(charged - (last[1] - first[1])) < 0.1, (charged, first, last)
    idle = monitor.cpu_seconds((spun + 0.5, spun + 1.0))
    assert idle is not None and idle < 0.05
    assert monitor.cpu_seconds((spun, spun + 60)) is None  # not sampled that far
    assert monitor.summary((first[0], spun)).cpu_seconds is not None


def test_a_window_is_the_same_on_either_clock_and_one_never_sampled_is_not_measured() -> None:
    code = "import time\nwhile time.process_time() < 0.5: pass\ntime.sleep(60)"
    process = subprocess.Popen([sys.executable, "-c", code])
    try:
        with CpuMonitor(process.pid, interval_s=0.2) as monitor:
            time.sleep(0.3)
            wall, mono = (time.time(), time.time()), (time.monotonic(), time.monotonic())
            while used(process.pid) < 0.45:
                time.sleep(0.05)
            time.sleep(0.5)
            wall, mono = (wall[0], time.time()), (mono[0], time.monotonic())
            time.sleep(0.5)
    finally:
        process.kill()
        process.wait()
    on_wall, on_mono = monitor.cpu_seconds(wall), monitor.cpu_seconds(mono, monotonic=True)
    assert on_wall is not None and on_mono is not None and on_wall > 0.05, (on_wall, on_mono)
    # Both readings of each edge are taken microseconds apart: the same CPU, to a tick.
    assert abs(on_wall - on_mono) < 0.02, (on_wall, on_mono)
    assert monitor.summary(mono, monotonic=True).host_mean_percent is not None
    # Between two samples, none inside: not measured (a stalled sampler), not 0.
    first, second = (t for t, _ in monitor.summary().samples[:2])
    gap = (first + (second - first) / 3, first + 2 * (second - first) / 3)
    assert monitor.cpu_seconds(gap) is None
    assert monitor.summary(gap).host_mean_percent is None


def test_a_window_that_starts_as_the_monitor_does_is_covered_even_if_its_thread_starts_late(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A busy machine once ran the sampling thread after Locust had sent its first request:
    the run's window began before the first reading, and its CPU per request was not
    measured."""
    loop = CpuMonitor._loop

    def late(monitor: CpuMonitor) -> None:
        time.sleep(0.5)
        loop(monitor)

    monkeypatch.setattr(CpuMonitor, "_loop", late)
    with CpuMonitor(os.getpid(), interval_s=0.1) as monitor:
        started = time.time()
        time.sleep(1.0)
        ended = time.time()
    assert monitor.cpu_seconds((started, ended)) is not None
