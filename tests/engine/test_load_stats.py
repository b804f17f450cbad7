"""Load time and peak memory, measured on a stand-in server whose worker holds real memory."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from serving.engine.load_stats import LoadMonitor, LoadStats, tree_memory
from serving.engine.process import EngineProcess
from serving.vllm_flags import EngineCommand
from tests.engine.test_supervisor import FAKE
from tests.ports import free_port

MiB = 2**20


def loading_process(tmp_path: Path, *, ranks: int, load_mib: int) -> EngineProcess:
    port = free_port()
    argv = [sys.executable, FAKE, str(port), "--worker", "--load-mib", str(load_mib)]
    return EngineProcess(
        EngineCommand(argv=argv), f"http://127.0.0.1:{port}", tmp_path / "engine.log", ranks=ranks
    )


def test_peak_memory_and_load_time_of_a_loading_worker(tmp_path: Path) -> None:
    process = loading_process(tmp_path, ranks=1, load_mib=300)
    process.start()
    try:
        seconds = process.wait_healthy(timeout=30)
    finally:
        process.stop(grace=5)
    stats = process.load_stats
    assert stats is not None and stats.startup_seconds == seconds
    assert stats.weights_seconds == 0.25  # parsed from the worker's log line
    assert stats.load_seconds is not None and 0.5 < stats.load_seconds <= seconds
    # The worker held 300 MiB; two Python interpreters add some tens of MiB, not hundreds.
    assert 300 * MiB < stats.peak_memory_bytes < 500 * MiB, stats.peak_memory_bytes


def test_load_time_waits_for_every_rank(tmp_path: Path) -> None:
    process = loading_process(tmp_path, ranks=2, load_mib=50)  # only one rank logs
    process.start()
    try:
        process.wait_healthy(timeout=30)
    finally:
        process.stop(grace=5)
    assert process.load_stats is not None
    assert process.load_stats.load_seconds is None and process.load_stats.weights_seconds == 0.25
    assert process.load_stats.peak_memory_bytes > 50 * MiB


def test_monitor_reads_lines_split_across_reads(tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.write_bytes(b"--- starting\n")
    offset = log.stat().st_size
    monitor = LoadMonitor(
        os.getpid(), log, offset, ranks=2, started_at=time.monotonic(), interval=0.02
    )
    monitor.start()
    with log.open("ab") as handle:
        for part in (b"Loading weights to", b"ok 1.5 seconds\n", b"Loading weights took 2.0 s"):
            handle.write(part)
            handle.flush()
            time.sleep(0.1)
        handle.write(b"econds\n")
    time.sleep(0.3)
    stats = monitor.finish(3.0)
    # Both lines counted once, each whole: "took 1.5" was split between two writes.
    assert stats.weights_seconds == 2.0 and stats.load_seconds is not None


def test_a_line_logged_just_before_health_is_still_read(tmp_path: Path) -> None:
    # A busy machine can let /health answer before the monitor's next sample: the weights
    # line written in between must still count (seen in a clean-clone make test).
    log = tmp_path / "log"
    log.write_bytes(b"")
    monitor = LoadMonitor(os.getpid(), log, 0, ranks=1, started_at=time.monotonic(), interval=60)
    monitor.start()
    time.sleep(0.2)  # its first sample has read the empty log; the next is a minute away
    log.write_bytes(b"(Worker pid=1) INFO Loading weights took 0.25 seconds\n")
    assert monitor.finish(1.0).weights_seconds == 0.25


def test_describe_names_every_number() -> None:
    text = LoadStats(12.5, 10.0, 0.02, 3 * 2**30).describe()
    assert text == (
        "healthy after 12.5s, model loaded after 10.0s, weights read in 0.02s, "
        "peak host memory while loading 3.00 GiB"
    )
    assert "model loaded" not in LoadStats(5.0, None, None, 0).describe()


def test_tree_memory_counts_this_process_and_nothing_for_a_gone_one() -> None:
    import subprocess

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert tree_memory(os.getpid()) > 10 * MiB
    assert tree_memory(gone.pid) == 0
