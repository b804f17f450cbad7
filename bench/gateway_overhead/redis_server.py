"""The Redis behind the "gateway with the Redis store" path, and its command counters.

    redis = await start_redis(launcher, cpu=LOAD_CPU)  # Debian's redis-server, own port
    before = await redis.commands()                    # INFO stats commandstats
    ...                                                # one measurement
    sent = delta(before, await redis.commands())       # {"total": n, "evalsha": n, ...}

The server is started by the `Launcher` (so it is pinned, logged and stopped like every other
child) on a free port, with nothing saved to disk (`--save "" --appendonly no`): the
benchmark measures the gateway's round trips, not Redis's persistence.

Counters are Redis's own: `total_commands_processed` (INFO stats) and the calls of each
command (INFO commandstats), read with one INFO per reading. That INFO is itself a
command; `delta` takes it out, so what is left is what the gateway caused. Both counters
also count the commands a Lua script runs inside Redis (`redis.call`: HINCRBY, TIME, ...), so
`delta` also gives `round_trips`: the commands that came over the network, i.e. all but
those the gateway's scripts run (read from their source), EVALSHA itself included.
"""

from __future__ import annotations

import asyncio
import functools
import re
import shutil
from dataclasses import dataclass, replace

from bench.gateway_overhead.processes import BenchError, Launcher, free_port
from serving.gateway.quota.redis_scripts import SCRIPT_NAMES, script_source

READY_TIMEOUT_S = 30.0
IO_TIMEOUT_S = 5.0
TOTAL = "total"
ROUND_TRIPS = "round_trips"
_SCRIPT_CALL = re.compile(r"""redis\.p?call\(\s*['"]([A-Za-z]+)['"]""")


class RedisUnavailable(BenchError):
    """No redis-server to start (the path is then skipped, with this reason)."""


@dataclass(frozen=True)
class RedisServer:
    host: str
    port: int
    version: str = "?"

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    async def commands(self) -> dict[str, int]:
        """`total` (total_commands_processed) and the calls of each command so far.

        One INFO on a fresh connection, in plain RESP: no client library, so no handshake
        (HELLO, CLIENT SETINFO) is counted; the INFO itself is counted from the next
        reading on (`delta` takes it out)."""
        text = await self._call("INFO", "stats", "commandstats")
        counts: dict[str, int] = {}
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key == "total_commands_processed":
                counts[TOTAL] = int(value)
            elif key.startswith("cmdstat_"):
                # cmdstat_evalsha:calls=12,usec=340,...
                fields = dict(item.split("=", 1) for item in value.split(","))
                counts[key.removeprefix("cmdstat_")] = int(fields["calls"])
        if TOTAL not in counts:
            raise BenchError(f"redis: INFO has no total_commands_processed: {text[:200]!r}")
        return counts

    async def ready(self) -> str | None:
        """None once it answers PING, else why not."""
        try:
            answer = await self._call("PING")
        except (OSError, TimeoutError, BenchError) as exc:
            return f"{type(exc).__name__}: {exc}"
        return None if answer == "PONG" else f"PING answered {answer!r}"

    async def _call(self, *command: str) -> str:
        """Send one command and return its reply (a simple or bulk string)."""
        request = f"*{len(command)}\r\n" + "".join(
            f"${len(part.encode())}\r\n{part}\r\n" for part in command
        )
        async with asyncio.timeout(IO_TIMEOUT_S):
            reader, writer = await asyncio.open_connection(self.host, self.port)
            try:
                writer.write(request.encode())
                await writer.drain()
                head = (await reader.readline()).rstrip(b"\r\n")
                if head.startswith(b"+"):
                    return head[1:].decode()
                if not head.startswith(b"$"):
                    raise BenchError(f"redis: {' '.join(command)} answered {head[:200]!r}")
                body = await reader.readexactly(int(head[1:]) + 2)
                return body[:-2].decode()
            finally:
                writer.close()
                await writer.wait_closed()


@functools.cache
def script_commands() -> frozenset[str]:
    """The commands the gateway's Lua scripts run inside Redis, named as commandstats
    names them (lower case)."""
    return frozenset(
        name.lower()
        for script in SCRIPT_NAMES
        for name in _SCRIPT_CALL.findall(script_source(script))
    )


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """Commands processed between two readings, by name, with `total` and `round_trips`
    (those that came over the network, not from inside a script); without the `before`
    reading's own INFO (the `after` one is not counted yet when it reads)."""
    out = {
        name: after[name] - before.get(name, 0)
        for name in after
        if name not in (TOTAL, "info") and after[name] != before.get(name, 0)
    }
    inside = script_commands()
    out[ROUND_TRIPS] = sum(calls for name, calls in out.items() if name not in inside)
    out[TOTAL] = max(0, after[TOTAL] - before[TOTAL] - 1)
    return out


async def start_redis(launcher: Launcher, *, cpu: int, name: str = "redis") -> RedisServer:
    binary = shutil.which("redis-server")
    if binary is None:
        raise RedisUnavailable(
            "redis-server is missing: `make system-deps` installs Debian's package"
        )
    port = free_port()
    argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(launcher.workdir)]
    argv += ["--save", "", "--appendonly", "no", "--loglevel", "warning"]
    launcher.start(name, argv, cpu=cpu, cwd=launcher.workdir)
    server = RedisServer(host="127.0.0.1", port=port)
    await launcher.wait_until(name, server.ready, timeout_s=READY_TIMEOUT_S)
    info = await server._call("INFO", "server")
    version = next(
        (line.split(":", 1)[1] for line in info.splitlines() if line.startswith("redis_version:")),
        "?",
    )
    return replace(server, version=version)
