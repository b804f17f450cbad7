"""A real `redis-server` (Debian's package) for tests: its own port and directory, nothing
saved to disk, and the faults the store must survive (paused, killed, started again).

    server = RedisServer(tmp_path); server.start()
    server.pause() ... server.resume()       # SIGSTOP/SIGCONT: a black-holed server
    server.kill() ... server.start()         # gone, then back on the same port (empty)
    RedisServer(tmp_path, password="pw")     # clients must AUTH, as a deployment's would
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import redis

# Generous: this only bounds how long a broken start hangs, it is never waited out.
START_DEADLINE_S = 60.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


class RedisServer:
    def __init__(self, directory: Path, *, password: str | None = None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is missing: `make system-deps` installs Debian's package")
        self._binary = binary
        self._directory = directory
        self._password = password
        self.port = free_port()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self._password}@" if self._password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start (again, on the same port) and return once it answers PING."""
        self._directory.mkdir(parents=True, exist_ok=True)
        # Nothing on disk: a restart comes back empty, as a lost server would.
        command = [self._binary, "--port", str(self.port), "--bind", "127.0.0.1"]
        command += ["--save", "", "--appendonly", "no", "--dir", str(self._directory)]
        command += ["--loglevel", "warning"]
        if self._password:
            command += ["--requirepass", self._password]
        log = (self._directory / "redis.log").open("ab")
        self._process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + START_DEADLINE_S
        while not self.answers():
            if self._process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start on port {self.port}")
            time.sleep(0.02)

    def answers(self) -> bool:
        client = redis.Redis.from_url(self.url, socket_timeout=1, socket_connect_timeout=1)
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()

    def pause(self) -> None:
        """SIGSTOP: connections still open, nothing answers (a black hole)."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL: gone at once, with everything it held."""
        self._signal(signal.SIGKILL)
        assert self._process is not None
        self._process.wait()

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        os.kill(process.pid, signal.SIGCONT)  # a paused server cannot act on SIGTERM
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def _signal(self, number: signal.Signals) -> None:
        assert self._process is not None and self._process.poll() is None
        os.kill(self._process.pid, number)
