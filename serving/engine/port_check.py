"""A start never adopts what it did not start: every port the stack will listen on is free,
or the start is refused, naming the process that holds it.

    refuse_taken({8000: "the gateway's (--port)", 8001: "an engine's (--engine-port)"})

Without it an engine left behind by an earlier start answers the new launcher's health
checks on its port, and the stack serves through an engine started with another profile.
"""

from __future__ import annotations

import contextlib
import errno
import socket
from collections.abc import Mapping

import psutil

from serving.errors import ServingError


def refuse_taken(ports: Mapping[int, str], host: str = "127.0.0.1") -> None:
    """ServingError for the first port in `ports` (port -> whose, for the message) that
    cannot be bound on `host`."""
    for port, whose in ports.items():
        if _taken(host, port):
            raise ServingError(
                f"{whose} port {port} is already in use{_owner(port, host)}; stop it first"
            )


def _taken(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # as the servers bind: a port in TIME_WAIT after a clean stop is free
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return True
            raise
    return False


_ANY = frozenset({"0.0.0.0", "::"})


def listener(port: int, host: str | None = None) -> int | None:
    """The PID listening on TCP `port` (on `host`, or on every address; any address when
    `host` is None); None when none, or when this user may not see it. Two engines may listen
    on one port at two addresses (127.0.0.1 and 127.0.0.2): the address tells them apart."""
    with contextlib.suppress(psutil.Error, OSError):
        for connection in psutil.net_connections(kind="tcp"):
            address = connection.laddr
            if connection.status != psutil.CONN_LISTEN or not address or address.port != port:
                continue
            if host is None or address.ip == host or address.ip in _ANY:
                return connection.pid
    return None


def describe(pid: int) -> str:
    """'PID n (command line)'."""
    try:
        command = " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return f"PID {pid}"
    return f"PID {pid} ({command[:200]})"


def _owner(port: int, host: str) -> str:
    """' by PID n (command line)', when this user may see the listener's process."""
    pid = listener(port, None if host in _ANY else host)
    return "" if pid is None else f" by {describe(pid)}"
