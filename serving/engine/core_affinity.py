"""On the CPU build, run vLLM's EngineCore on its workers' cores, not on the cores it leaves free.

vLLM's CPU platform binds each worker's OpenMP threads to cores of its own and leaves at
least one core for everything else (`VLLM_CPU_OMP_THREADS_BIND=auto`). Its EngineCore process
waits for the workers' results by polling shared memory (`shm_broadcast`: `sched_yield` in a
loop), so on a small host it takes half of the free core from the API server, the gateway and
the clients. Measured on the 2-core machine with `python -m loadtest memory` (cpu-tiny-smallkv,
4 and 5 users): unpinned, vLLM's /metrics took 2 to 10 s to answer and the engine sat idle
between requests (a median of 0 running where 4 fit, 430-550 output tok/s); with the
EngineCore on the worker's core, /metrics answered in under 0.12 s, 4 running and 1 waiting
as planned, 725-784 tok/s. On the worker's core the poll costs little: it yields to the worker
while the worker computes, and the worker waits for it while it schedules.

Only the process's main thread (the one that polls) is moved; nothing is moved where the
workers run elsewhere (Ray), already share every core with it, or share their cores with
another engine's workers: vLLM binds the workers of every engine on a small host to the same
cores, and with two engines' EngineCores there too, the second engine's first request waited
over 60 s while the first engine served 1,014 (a clean clone's engine-discovery test, twice).

Usage: `pin_engine_core(server_pid)` once vLLM answers /health (its workers are bound by then);
it returns a line for the log, or None when it moved nothing.
"""

from __future__ import annotations

import contextlib

import psutil

ENGINE_CORE = "VLLM::EngineCore"
WORKER = "VLLM::Worker"


def _title(process: psutil.Process) -> str:
    """vLLM's process title (setproctitle rewrites argv; /proc/comm truncates it)."""
    with contextlib.suppress(psutil.Error):
        argv = process.cmdline()
        if argv:
            return argv[0]
    return ""


def _other_workers_cpus(ours: set[int]) -> set[int]:
    """The CPUs that vLLM workers of other engines on this host are bound to."""
    cpus: set[int] = set()
    for process in psutil.process_iter():
        if process.pid in ours or not _title(process).startswith(WORKER):
            continue
        with contextlib.suppress(psutil.Error):
            cpus.update(process.cpu_affinity() or [])
    return cpus


def pin_engine_core(server_pid: int) -> str | None:
    try:
        children = psutil.Process(server_pid).children(recursive=True)
    except psutil.Error:
        return None
    titled = [(child, _title(child)) for child in children]  # one /proc read each
    cores = [child for child, title in titled if title.startswith(ENGINE_CORE)]
    workers = [child for child, title in titled if title.startswith(WORKER)]
    try:
        worker_cpus = {cpu for worker in workers for cpu in worker.cpu_affinity() or []}
        if worker_cpus & _other_workers_cpus({child.pid for child in children}):
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
