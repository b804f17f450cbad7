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

from serving.engine.core_affinity import BIND, pin_engine_core, spread_binding

# The server starts an EngineCore, which starts a worker bound to `cpus` (as vLLM binds its
# workers' OpenMP threads), each under vLLM's process title.
TREE = textwrap.dedent(
    """
    import os, subprocess, sys, time, setproctitle
    role, cpus = sys.argv[1], [int(c) for c in sys.argv[2].split(",")]
    again = [sys.executable, "-c", sys.argv[3]]
    if role == "server":
        subprocess.Popen([*again, "core", *sys.argv[2:]])
    elif role == "core":
        setproctitle.setproctitle("VLLM::EngineCore")
        subprocess.Popen([*again, "worker", *sys.argv[2:]])
    else:
        setproctitle.setproctitle("VLLM::Worker")
        os.sched_setaffinity(0, cpus)
    time.sleep(60)
    """
)


@contextmanager
def vllm_like_tree(worker_cpus: list[int]) -> Iterator[int]:
    cpus = ",".join(map(str, worker_cpus))
    server = subprocess.Popen([sys.executable, "-c", TREE, "server", cpus, TREE])
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


def test_beside_another_engines_worker_neither_engine_core_stays_on_the_shared_cpus() -> None:
    cpus = sorted(os.sched_getaffinity(0))
    with vllm_like_tree(cpus[:1]) as first:
        engine_core(first).cpu_affinity(cpus[:1])  # pinned while it ran alone
        with vllm_like_tree(cpus[:1]) as second:
            line = pin_engine_core(second)
            assert engine_core(second).cpu_affinity() == cpus
            assert engine_core(first).cpu_affinity() == cpus
            assert line == (
                f"vLLM's EngineCore (PID {engine_core(first).pid}) of another engine is back on "
                f"every CPU: its workers share this engine's workers' CPUs {cpus[:1]}"
            )
            assert pin_engine_core(second) is None  # nothing left to move


def test_a_second_engine_is_bound_to_cores_no_other_engines_worker_holds() -> None:
    cpus = sorted(os.sched_getaffinity(0))
    assert spread_binding({}, 1) == {}  # alone: vLLM's own binding
    with vllm_like_tree(cpus[:1]):
        free = cpus[1:-1] if len(cpus) > 2 else cpus[1:]  # one left for the rest
        assert spread_binding({}, 1) == {BIND: ",".join(map(str, free))}
        assert spread_binding({BIND: "0"}, 1) == {}  # the profile's own binding
        assert spread_binding({}, 2) == {}  # several workers: vLLM binds them
    with vllm_like_tree(cpus):
        assert spread_binding({}, 1) == {}  # every core held: vLLM's own binding
