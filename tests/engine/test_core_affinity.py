"""The EngineCore moves onto its workers' cores: a process tree titled as vLLM titles its own."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psutil

from serving.engine.core_affinity import pin_engine_core

# The server starts an EngineCore, which starts a worker bound to `cpus` (as vLLM binds its
# workers' OpenMP threads), each under vLLM's process title; a busy worker computes
# without a pause, as one serving requests does.
TREE = textwrap.dedent(
    """
    import os, subprocess, sys, time, setproctitle
    role, cpus, busy = sys.argv[1], [int(c) for c in sys.argv[2].split(",")], sys.argv[3]
    again = [sys.executable, "-c", sys.argv[4]]
    if role == "server":
        subprocess.Popen([*again, "core", *sys.argv[2:]])
    elif role == "core":
        setproctitle.setproctitle("VLLM::EngineCore")
        subprocess.Popen([*again, "worker", *sys.argv[2:]])
    else:
        setproctitle.setproctitle("VLLM::Worker")
        os.sched_setaffinity(0, cpus)
        while busy == "busy":
            pass
    time.sleep(60)
    """
)


@contextmanager
def vllm_like_tree(worker_cpus: list[int], *, busy: bool = False) -> Iterator[int]:
    cpus = ",".join(map(str, worker_cpus))
    load = "busy" if busy else "idle"
    server = subprocess.Popen([sys.executable, "-c", TREE, "server", cpus, load, TREE])
    try:
        deadline = time.monotonic() + 30
        while not any(
            p.cmdline()[:1] == ["VLLM::Worker"] and p.cpu_affinity() == worker_cpus
            for p in psutil.Process(server.pid).children(recursive=True)
        ):
            assert time.monotonic() < deadline, "the worker never bound its CPUs"
            time.sleep(0.1)
        yield server.pid
    finally:
        for child in psutil.Process(server.pid).children(recursive=True):
            child.kill()
        server.kill()
        server.wait()


def engine_core(server_pid: int) -> psutil.Process:
    children = psutil.Process(server_pid).children(recursive=True)
    return next(p for p in children if p.cmdline()[:1] == ["VLLM::EngineCore"])


def test_the_engine_core_moves_onto_the_workers_cpus() -> None:
    cpus = sorted(os.sched_getaffinity(0))
    assert len(cpus) >= 2, "needs two CPUs: the machines this suite runs on have them"
    with vllm_like_tree(cpus[:1]) as server:
        assert engine_core(server).cpu_affinity() == cpus
        line = pin_engine_core(server)
        assert engine_core(server).cpu_affinity() == cpus[:1]
        assert line == (
            f"vLLM's EngineCore (PID {engine_core(server).pid}) runs on its workers' CPUs "
            f"{cpus[:1]}"
        )
        assert pin_engine_core(server) is None  # already there: nothing moved, nothing said


def test_nothing_moves_when_the_workers_have_every_cpu_or_no_worker_is_a_child() -> None:
    cpus = sorted(os.sched_getaffinity(0))
    with vllm_like_tree(cpus) as server:
        assert pin_engine_core(server) is None
        assert engine_core(server).cpu_affinity() == cpus
    assert pin_engine_core(os.getpid()) is None  # no vLLM below this process (Ray workers)


def test_nothing_moves_where_a_busy_worker_of_another_engine_shares_the_cpus() -> None:
    cpus = sorted(os.sched_getaffinity(0))
    with vllm_like_tree(cpus[:1], busy=True), vllm_like_tree(cpus[:1]) as second:
        assert pin_engine_core(second) is None
        assert engine_core(second).cpu_affinity() == cpus


def test_an_idle_engine_beside_it_does_not_keep_the_engine_core_off_its_cpus() -> None:
    cpus = sorted(os.sched_getaffinity(0))
    with vllm_like_tree(cpus[:1]) as first, vllm_like_tree(cpus[:1]) as second:
        assert pin_engine_core(second) is not None
        assert engine_core(second).cpu_affinity() == cpus[:1]
        assert engine_core(first).cpu_affinity() == cpus  # the idle one is not touched
