"""Free TCP ports on loopback, for servers the tests start."""

from __future__ import annotations

import random
import socket


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_port_block(size: int = 64) -> int:
    """The first of `size` consecutive free ports, below Linux's ephemeral range (32768+) so
    that no outgoing connection takes one of them meanwhile (a Ray node's, `port_block`)."""
    for _ in range(200):
        base = random.randrange(20000, 32768 - size)
        try:
            for port in range(base, base + size):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError("no free block of ports")
