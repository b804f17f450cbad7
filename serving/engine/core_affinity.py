"""On the CPU build, run vLLM's EngineCore on its workers' cores, not on the cores it leaves free.

vLLM binds each CPU worker's OpenMP threads to cores of its own and leaves the rest to the API
server, the gateway and the clients; its EngineCore waits for the workers by polling shared
memory (a `sched_yield` loop), which on a small host takes much of that free core
(docs/profiles.md#running-the-engine-on-its-own has the measurements). Only the EngineCore is
moved, and nothing where the workers run elsewhere (Ray), already have every core, or share
their cores with a busy worker of another engine (two busy engines' EngineCores on one core
starved the second engine's requests).

Usage: `pin_engine_core(server_pid)` once vLLM answers /health (its workers are bound by then;
it samples its neighbours for a second when it has any); it returns a line for the log, or
None when it moved nothing.
"""

from __future__ import annotations

import contextlib
import time

import psutil

ENGINE_CORE = "VLLM::EngineCore"
WORKER = "VLLM::Worker"
# Another engine's worker is busy when it used this share of a CPU over the sample: serving, a
# worker computes most of the time; idle, it used 1%.
BUSY_SHARE = 0.25
SAMPLE_S = 1.0


def _title(process: psutil.Process) -> str:
    """vLLM's process title (setproctitle rewrites argv; /proc/comm truncates it)."""
    with contextlib.suppress(psutil.Error):
        argv = process.cmdline()
        if argv:
            return argv[0]
    return ""


def _cpu_seconds(process: psutil.Process) -> float | None:
    with contextlib.suppress(psutil.Error):
        times = process.cpu_times()
        return float(times.user + times.system)
    return None


def _busy_neighbours(ours: set[int], cpus: set[int], sample_s: float) -> bool:
    """Whether a vLLM worker of another engine bound to one of `cpus` is busy (sampled)."""
    neighbours = []
    for process in psutil.process_iter():
        if process.pid in ours or not _title(process).startswith(WORKER):
            continue
        with contextlib.suppress(psutil.Error):
            if cpus & set(process.cpu_affinity() or []):
                neighbours.append(process)
    if not neighbours:
        return False
    before = [_cpu_seconds(process) for process in neighbours]
    time.sleep(sample_s)
    after = [_cpu_seconds(process) for process in neighbours]
    return any(
        start is not None and end is not None and end - start >= BUSY_SHARE * sample_s
        for start, end in zip(before, after, strict=True)
    )


def pin_engine_core(server_pid: int, sample_s: float = SAMPLE_S) -> str | None:
    try:
        children = psutil.Process(server_pid).children(recursive=True)
    except psutil.Error:
        return None
    titled = [(child, _title(child)) for child in children]  # one /proc read each
    cores = [child for child, title in titled if title.startswith(ENGINE_CORE)]
    workers = [child for child, title in titled if title.startswith(WORKER)]
    try:
        worker_cpus = {cpu for worker in workers for cpu in worker.cpu_affinity() or []}
        if _busy_neighbours({child.pid for child in children}, worker_cpus, sample_s):
            return None
        moved = []
        for core in cores:
            if worker_cpus and worker_cpus < set(core.cpu_affinity() or []):
                core.cpu_affinity(sorted(worker_cpus))
                moved.append(core.pid)
    except psutil.Error:
        return None  # a process ended meanwhile (a restart): the next start pins again
    if not moved:
        return None
    pids = ", ".join(map(str, moved))
    return f"vLLM's EngineCore (PID {pids}) runs on its workers' CPUs {sorted(worker_cpus)}"
