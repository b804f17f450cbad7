"""A real `redis-server` (Debian's package) for tests: its own port and directory, nothing
saved to disk unless asked, and the faults the store must survive (paused, killed, started
again).

    server = RedisServer(tmp_path); server.start()
    server.pause() ... server.resume()       # SIGSTOP/SIGCONT: a black-holed server
    server.kill() ... server.start()         # gone, then back on the same port (empty)
    RedisServer(tmp_path, persistent=True)   # ... back with its data (an append-only file)
    RedisServer(tmp_path, password="pw")     # clients must AUTH, as a deployment's would
    RedisServer(tmp_path, unix_socket=True)  # also on a unix socket: `unix_url`
    RedisServer(tmp_path, tls=TlsFiles.make(tmp_path))   # also over TLS: `tls_url`

The plain TCP port is always there: `url`, and the admin client of the tests, use it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.services import require

# Generous: this only bounds how long a broken start hangs, it is never waited out.
START_DEADLINE_S = 60.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@dataclass(frozen=True)
class TlsFiles:
    """A self-signed certificate for `localhost` and 127.0.0.1, made by the openssl CLI."""

    cert: Path
    key: Path

    @classmethod
    def make(cls, directory: Path) -> TlsFiles:
        openssl = shutil.which("openssl")
        if openssl is None:
            pytest.fail("openssl is missing (Debian's openssl package)")
        directory.mkdir(parents=True, exist_ok=True)
        files = cls(directory / "cert.pem", directory / "key.pem")
        command = [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
        command += ["-keyout", str(files.key), "-out", str(files.cert), "-subj", "/CN=localhost"]
        command += ["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"]
        subprocess.run(command, check=True, capture_output=True, timeout=60)
        return files


class RedisServer:
    def __init__(
        self,
        directory: Path,
        *,
        password: str | None = None,
        persistent: bool = False,
        unix_socket: bool = False,
        tls: TlsFiles | None = None,
    ) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is missing: `make system-deps` installs Debian's package")
        self._binary = binary
        self._directory = directory
        self._password = password
        self._persistent = persistent
        self._tls = tls
        self.port = free_port()
        self.tls_port = free_port() if tls is not None else None
        # Unix socket paths are short (108 bytes): not under a deep tmp_path.
        self.socket_path = (
            f"/tmp/redis-test-{os.getpid()}-{self.port}.sock" if unix_socket else None
        )
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{self._auth}127.0.0.1:{self.port}/0"

    @property
    def tls_url(self) -> str:
        assert self.tls_port is not None, "started without tls"
        return f"rediss://{self._auth}localhost:{self.tls_port}/0"

    @property
    def unix_url(self) -> str:
        assert self.socket_path is not None, "started without a unix socket"
        return f"unix://{self._auth}{self.socket_path}"

    @property
    def _auth(self) -> str:
        return f":{self._password}@" if self._password else ""

    def start(self) -> None:
        """Start (again, on the same port) and return once it answers PING."""
        require("redis")
        self._directory.mkdir(parents=True, exist_ok=True)
        command = [self._binary, "--port", str(self.port), "--bind", "127.0.0.1"]
        command += ["--dir", str(self._directory), "--loglevel", "warning", "--save", ""]
        if self._persistent:
            # Every write on disk before it is answered: a killed server comes back whole.
            command += ["--appendonly", "yes", "--appendfsync", "always"]
        else:
            # Nothing on disk: a restart comes back empty, as a lost server would.
            command += ["--appendonly", "no"]
        if self._password:
            command += ["--requirepass", self._password]
        if self.socket_path is not None:
            command += ["--unixsocket", self.socket_path, "--unixsocketperm", "700"]
        if self._tls is not None:
            command += ["--tls-port", str(self.tls_port), "--tls-auth-clients", "no"]
            command += [
                "--tls-cert-file",
                str(self._tls.cert),
                "--tls-key-file",
                str(self._tls.key),
            ]
            command += ["--tls-ca-cert-file", str(self._tls.cert)]
        log = (self._directory / "redis.log").open("ab")
        self._process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + START_DEADLINE_S
        while not self.answers():
            if self._process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start on port {self.port}")
            time.sleep(0.02)

    def admin(self, *, db: int = 0, **options: Any) -> redis.Redis:
        """A client of the test's own (redis-py, synchronous) on the plain port."""
        return redis.Redis.from_url(self.url.removesuffix("/0") + f"/{db}", **options)

    def answers(self) -> bool:
        client = self.admin(socket_timeout=1, socket_connect_timeout=1)
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()

    def flush(self) -> None:
        """Empty its database (FLUSHDB), from a client of the test's own."""
        with self.admin() as admin:
            admin.flushdb()

    def commands(self) -> dict[str, int]:
        """Calls of each command so far (INFO commandstats; the readings count as `info`)."""
        with self.admin() as admin:
            stats = admin.info("commandstats")
        return {name.removeprefix("cmdstat_"): int(row["calls"]) for name, row in stats.items()}

    def pause(self) -> None:
        """SIGSTOP: connections still open, nothing answers (a black hole)."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL: gone at once, with everything it held in memory."""
        self._signal(signal.SIGKILL)
        assert self._process is not None
        self._process.wait()

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            os.kill(process.pid, signal.SIGCONT)  # a paused server cannot act on SIGTERM
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self.socket_path is not None and os.path.exists(self.socket_path):
            os.unlink(self.socket_path)

    def _signal(self, number: signal.Signals) -> None:
        assert self._process is not None and self._process.poll() is None
        os.kill(self._process.pid, number)
