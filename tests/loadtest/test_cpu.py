from __future__ import annotations

import subprocess
import sys
import time

from loadtest.cpu import CpuMonitor


def watch(code: str) -> float:
    process = subprocess.Popen([sys.executable, "-c", code])
    try:
        with CpuMonitor(process.pid, interval_s=0.25) as monitor:
            time.sleep(2.0)
    finally:
        process.kill()
        process.wait()
    summary = monitor.summary()
    assert summary.processes == 1 and summary.samples
    return summary.max_mean_percent


def test_a_busy_load_generator_is_flagged_and_an_idle_one_is_not() -> None:
    # Loose bounds: the 2-core CI machine may be shared with other busy processes.
    assert watch("while True: pass") > 25
    assert watch("import time; time.sleep(30)") < 10
