"""Drive one `python -m loadtest.vllm_bench --worker` process through the cross-check's rounds.

The worker imports vLLM once and runs one `vllm bench serve` per round. A CpuMonitor
watches its process tree the whole time, so each round is charged the CPU seconds the
client used between its first request's start and its last one's end (vLLM's start-up,
tokenizer loading and result printing fall outside that window).

Usage: `with VllmBenchWorker(log=path, api_key=key) as w: result = w.run(args, out=path)`.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from loadtest.cpu import CpuMonitor
from loadtest.errors import LoadTestError

# The longest one round may take (start-up, a ready check, every request), generously.
ROUND_TIMEOUT_S = 1800.0
READY_TIMEOUT_S = 600.0
CPU_INTERVAL_S = 0.25


class VllmBenchWorker:
    def __init__(self, *, log: Path, api_key: str | None = None) -> None:
        self.log = log
        self.api_key = api_key
        self._process: subprocess.Popen[str] | None = None
        self._monitor: CpuMonitor | None = None
        self._sink: IO[str] | None = None

    def __enter__(self) -> VllmBenchWorker:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        if self.api_key:
            env["OPENAI_API_KEY"] = self.api_key
        self._sink = self.log.open("w")
        self._process = subprocess.Popen(
            [sys.executable, "-m", "loadtest.vllm_bench", "--worker"],
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._sink, text=True,
        )  # fmt: skip
        # vLLM's import takes seconds of CPU: wait for it, or it would run beside a round.
        assert self._process.stdout is not None
        answer = _read_line(self._process.stdout, READY_TIMEOUT_S)
        if answer != "ready":
            self._process.kill()
            self._process.wait()
            self._sink.close()
            tail = self.log.read_text(errors="replace")[-2000:]
            raise LoadTestError(f"vllm bench worker did not start ({answer!r}):\n{tail}")
        self._monitor = CpuMonitor(self._process.pid, interval_s=CPU_INTERVAL_S).__enter__()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._monitor is not None:
            self._monitor.__exit__(kind, value, tb)
        if self._process is not None:
            if self._process.stdin is not None:
                self._process.stdin.close()  # the worker's loop ends at end of input
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        if self._sink is not None:
            self._sink.close()

    def run(self, bench_args: list[str], *, out: Path) -> dict[str, Any]:
        """One `vllm bench serve` run; its result plus `cpu_seconds` and `host_cpu_percent`."""
        process, monitor = self._process, self._monitor
        assert process is not None and process.stdin is not None and process.stdout is not None
        assert monitor is not None
        out.unlink(missing_ok=True)
        process.stdin.write(json.dumps({"out": str(out), "args": bench_args}) + "\n")
        process.stdin.flush()
        answer = _read_line(process.stdout, ROUND_TIMEOUT_S)
        if answer != "done" or not out.exists():
            tail = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            code = process.poll()
            raise LoadTestError(
                f"vllm bench serve failed ({answer or f'worker exited with {code}'}):\n{tail}"
            )
        result: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
        window = result.get("monotonic_window")
        if window:
            # The monitor samples every CPU_INTERVAL_S: let one sample land past the window.
            time.sleep(2 * CPU_INTERVAL_S)
            summary = monitor.summary((window[0], window[1]), monotonic=True)
            result["cpu_seconds"] = summary.cpu_seconds
            result["host_cpu_percent"] = summary.host_mean_percent
        return result


def _read_line(stream: IO[str], timeout_s: float) -> str:
    """The worker's next answer line ('' if it closed its output or timed out)."""
    with selectors.DefaultSelector() as selector:
        selector.register(stream, selectors.EVENT_READ)
        if not selector.select(timeout_s):
            return ""
    return stream.readline().strip()
