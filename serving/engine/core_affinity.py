"""On the CPU build, give each engine on a host cores of its own and its EngineCore a place there.

vLLM binds each CPU worker's OpenMP threads to cores (`VLLM_CPU_OMP_THREADS_BIND=auto`) and
leaves the rest to the API server, the gateway and the clients. Two rules on top:
- `spread_binding`: auto binds every engine on a host to the same cores, so a second engine
  started beside a first is bound to cores no other engine's worker holds, while any are left.
- `pin_engine_core`: the EngineCore waits for its workers by polling shared memory (a
  `sched_yield` loop), which on a small host takes much of the free core
  (docs/profiles.md#running-the-engine-on-its-own has the measurements); it moves onto its
  workers' cores, unless another engine's worker is bound there too (two EngineCores on one
  shared core starved the second engine's requests): then neither stays, an EngineCore pinned
  there while it ran alone goes back to every CPU.

Usage: `env |= spread_binding(env, ranks)` before vLLM starts; `pin_engine_core(server_pid)`
once it answers /health (its workers are bound by then): a line for the log, or None.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping

import psutil

ENGINE_CORE = "VLLM::EngineCore"
WORKER = "VLLM::Worker"
BIND = "VLLM_CPU_OMP_THREADS_BIND"


def _title(process: psutil.Process) -> str:
    """vLLM's process title (setproctitle rewrites argv; /proc/comm truncates it)."""
    with contextlib.suppress(psutil.Error):
        argv = process.cmdline()
        if argv:
            return argv[0]
    return ""


def _neighbours(ours: set[int], cpus: set[int]) -> list[psutil.Process]:
    """The vLLM workers of other engines on this host bound to one of `cpus`."""
    found = []
    for process in psutil.process_iter():
        if process.pid in ours or not _title(process).startswith(WORKER):
            continue
        with contextlib.suppress(psutil.Error):
            if cpus & set(process.cpu_affinity() or []):
                found.append(process)
    return found


def spread_binding(env: Mapping[str, str], ranks: int) -> dict[str, str]:
    """The binding for an engine of `ranks` workers started with environment `env`: cores no
    other engine's worker holds (one left free for the rest when several are), or nothing
    (vLLM's auto) when it is alone, `env` sets one, it has several workers or every core is held."""
    if ranks != 1 or BIND in env:
        return {}
    allowed = sorted(os.sched_getaffinity(0))
    held: set[int] = set()
    for worker in _neighbours(set(), set(allowed)):
        with contextlib.suppress(psutil.Error):
            held.update(worker.cpu_affinity() or [])
    free = [cpu for cpu in allowed if cpu not in held]
    if not held or not free:
        return {}
    cores = free[:-1] if len(free) > 1 else free
    return {BIND: ",".join(map(str, cores))}


def _release(workers: list[psutil.Process], cpus: list[int]) -> list[int]:
    """Move the EngineCores above `workers` (pinned when they ran alone) back onto `cpus`."""
    moved = []
    for worker in workers:
        with contextlib.suppress(psutil.Error):
            parent = worker.parent()
            if parent is None or not _title(parent).startswith(ENGINE_CORE):
                continue
            if set(parent.cpu_affinity() or []) < set(cpus):
                parent.cpu_affinity(cpus)
                moved.append(parent.pid)
    return moved


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
        shared = _neighbours({child.pid for child in children}, worker_cpus)
        if shared:
            released = _release(shared, psutil.Process(server_pid).cpu_affinity() or [])
            if not released:
                return None
            pids = ", ".join(map(str, released))
            return (
                f"vLLM's EngineCore (PID {pids}) of another engine is back on every CPU: its "
                f"workers share this engine's workers' CPUs {sorted(worker_cpus)}"
            )
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
