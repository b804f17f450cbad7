"""Keep a vLLM server running the way a process supervisor would.

A server that dies is restarted after a backoff that doubles up to a cap; a server that keeps
dying (a crash loop: `max_restarts` deaths inside `window_s`) is given up on with a message
naming the log, instead of burning the machine forever.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from serving.engine.process import EngineProcess, ProgressFn, Stopped, tail_lines
from serving.errors import ServingError


@dataclass(frozen=True)
class RestartPolicy:
    """`RestartPolicy(initial_backoff_s=1, max_backoff_s=30, max_restarts=5, window_s=300)`."""

    initial_backoff_s: float = 1.0
    max_backoff_s: float = 30.0
    max_restarts: int = 5
    window_s: float = 300.0
    start_timeout_s: float = 600.0


@dataclass
class Supervisor:
    """Runs `make_process()` until `stop()`; restarts it with backoff when it dies."""

    make_process: Callable[[], EngineProcess]
    policy: RestartPolicy = field(default_factory=RestartPolicy)
    progress: ProgressFn | None = None
    on_event: Callable[[str], None] = print
    # Called after every healthy start with the process and whether it was a restart.
    on_started: Callable[[EngineProcess, bool], None] | None = None
    # Called once `stop()` has stopped the server: what the server ran on (a Ray head) goes.
    on_stop: Callable[[], None] | None = None
    # Called with how the running server went when `stop()` stopped it.
    on_stopped: Callable[[Stopped], None] | None = None
    current: EngineProcess | None = None
    restarts: int = 0
    _stopping: threading.Event = field(default_factory=threading.Event)
    _deaths: deque[float] = field(default_factory=deque)

    def start(self) -> float:
        """Start the server and wait until it is healthy; returns the start-up seconds."""
        self.launch()
        return self.wait_started()

    def launch(self) -> None:
        """Start the server without waiting (`wait_started` waits): several engines load at
        once."""
        self.current = self.make_process()
        self.current.start()

    def wait_started(self) -> float:
        """Wait until the launched server is healthy; returns the start-up seconds."""
        if self.current is None:
            raise RuntimeError("wait_started() before launch()")
        seconds = self.current.wait_healthy(self.policy.start_timeout_s, self.progress)
        if self.on_started is not None:
            self.on_started(self.current, self.restarts > 0)
        return seconds

    def stop(self) -> None:
        self._stopping.set()
        stopped = None if self.current is None else self.current.stop()
        if stopped is not None and self.on_stopped is not None:
            self.on_stopped(stopped)
        if self.on_stop is not None:
            self.on_stop()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def watch(self, poll_s: float = 1.0) -> None:
        """Block until `stop()`; restart the server whenever it exits on its own."""
        backoff = self.policy.initial_backoff_s
        while not self._stopping.wait(poll_s):
            process = self.current
            if process is None:
                return
            code = process.exit_code()
            if code is None:
                continue
            now = time.monotonic()
            self._deaths.append(now)
            while self._deaths and now - self._deaths[0] > self.policy.window_s:
                self._deaths.popleft()
            if len(self._deaths) > self.policy.max_restarts:
                last = "\n  ".join(tail_lines(process.log_path, 10))
                raise ServingError(
                    f"vLLM crashed {len(self._deaths)} times in {self.policy.window_s:.0f}s; "
                    f"giving up (log {process.log_path}):\n  {last}"
                )
            process.stop()
            self.on_event(f"vLLM exited with code {code}; restarting in {backoff:.0f}s")
            if self._stopping.wait(backoff):
                return
            backoff = min(backoff * 2, self.policy.max_backoff_s)
            self.restarts += 1
            try:
                seconds = self.start()
            except ServingError as exc:
                self.on_event(f"restart failed: {str(exc).splitlines()[0]}")
                continue
            self.on_event(f"vLLM healthy again after {seconds:.1f}s (restart {self.restarts})")
            backoff = self.policy.initial_backoff_s
