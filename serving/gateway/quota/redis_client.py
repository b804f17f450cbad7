"""The gateway's one Redis client: one pipelined connection, opened when needed.

    client = RedisClient.from_url("redis://:pw@redis:6379/0", timeout_s=0.25)
    reply = await client.run_script(script, keys, args)        # EVALSHA; EVAL on NOSCRIPT
    replies = await client.transaction(("HSETNX", h, f, v), ("SET", k, v))   # MULTI ... EXEC

Quotas, usage ledger, keys and adapters each use a client of their own (docs/gateway.md,
"Shared quotas (Redis)"). Not redis-py: its per-call machinery (pool, packing in Python, reply
callbacks, a timeout context) was most of what the Redis store cost. The rules:
- A call is bounded by `timeout_s` from its start, connecting and AUTH/SELECT included.
- One connection, of the loop that opened it; when it is lost, closed or stalls, the calls
  waiting on it fail and the next call opens a new one.
- A transaction's MULTI, commands and EXEC are written together: Redis runs them as one.
- Nothing is retried (a command may have run) but NOSCRIPT, sent once in full with EVAL.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ssl
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import hiredis

from serving.gateway.quota.redis_connection import (
    RedisConnectError,
    RedisConnection,
    RedisConnectionError,
    RedisError,
    RedisReplyError,
)

Arg = str | int | float | bytes
DEFAULT_PORT = 6379
# A connection owing replies that hears nothing for this many timeouts is given up on.
STALL_TIMEOUTS = 4
MIN_STALL_LIMIT_S = 1.0
# How long `close` waits for the socket to be shut.
CLOSE_WAIT_S = 1.0


@dataclass(frozen=True)
class RedisEndpoint:
    """Where Redis is and how to say hello to it (from `parse_url`)."""

    host: str = "localhost"
    port: int = DEFAULT_PORT
    unix_path: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    db: int = 0
    tls: ssl.SSLContext | None = None


def parse_url(url: str) -> RedisEndpoint:
    """A URL as redis-py spells them: `redis://[[user]:password@]host[:port][/db]`;
    `rediss://` the same over TLS (the system's CAs, or `?ssl_ca_certs=FILE`;
    `?ssl_cert_reqs=none` skips verification, `?ssl_check_hostname=false` only the name check;
    a client certificate with `?ssl_certfile=FILE&ssl_keyfile=FILE`);
    `unix://[[user]:password@]/path/to/redis.sock[?db=N]`. Other query parameters (redis-py's
    socket and pool options) are ignored. Errors never show the URL: it may hold a password."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"not a valid Redis URL ({type(exc).__name__})") from None
    query = {name: values[-1] for name, values in parse_qs(parts.query).items()}
    username = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password is not None else None
    db_text = query.get("db", "")
    if parts.scheme in ("redis", "rediss"):
        if not parts.hostname:
            raise ValueError("a redis:// URL needs a host")
        db_text = parts.path.strip("/") or db_text
    elif parts.scheme == "unix":
        if not parts.path:
            raise ValueError("a unix:// URL needs the socket's path")
    else:
        raise ValueError("must be a redis://, rediss:// or unix:// URL")
    if db_text and not db_text.isdigit():
        raise ValueError("the database must be a number (redis://host:6379/0)")
    return RedisEndpoint(
        host=parts.hostname or "localhost",
        port=port or DEFAULT_PORT,
        unix_path=parts.path if parts.scheme == "unix" else None,
        username=username,
        password=password,
        db=int(db_text or 0),
        tls=_tls_context(query) if parts.scheme == "rediss" else None,
    )


def _tls_context(query: dict[str, str]) -> ssl.SSLContext:
    """redis-py's query parameters for TLS: `ssl_ca_certs`, `ssl_cert_reqs`,
    `ssl_check_hostname`, `ssl_certfile` and `ssl_keyfile`."""
    try:
        context = ssl.create_default_context(cafile=query.get("ssl_ca_certs"))
        certfile = query.get("ssl_certfile")
        if certfile:
            context.load_cert_chain(certfile, query.get("ssl_keyfile") or None)
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
        raise ValueError(f"cannot read the TLS files of the URL ({type(exc).__name__})") from None
    requirement = query.get("ssl_cert_reqs", "required").lower()
    if requirement == "none":
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif requirement == "optional":
        context.check_hostname = False
        context.verify_mode = ssl.CERT_OPTIONAL
    elif requirement != "required":
        raise ValueError("ssl_cert_reqs must be none, optional or required")
    # As redis-py reads a boolean: these are false, anything else true.
    if query.get("ssl_check_hostname", "").upper() in ("0", "F", "FALSE", "N", "NO"):
        context.check_hostname = False
    return context


@dataclass(frozen=True)
class LuaScript:
    """A script sent by its SHA1 (EVALSHA), and in full when Redis does not know it."""

    source: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source.encode()).hexdigest())


def pack(args: tuple[Arg, ...]) -> bytes:
    """One command in RESP, packed by hiredis in C."""
    packed: bytes = hiredis.pack_command(args)  # type: ignore[arg-type]  # stub: a 1-tuple
    return packed


class RedisClient:
    """See the module docstring. `from_url` for a URL; nothing is opened until a call."""

    def __init__(self, endpoint: RedisEndpoint, *, timeout_s: float) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self._stall_limit_s = max(MIN_STALL_LIMIT_S, STALL_TIMEOUTS * timeout_s)
        self._current: RedisConnection | None = None
        self._opening: asyncio.Task[RedisConnection] | None = None
        self._closed = False

    @classmethod
    def from_url(cls, url: str, *, timeout_s: float) -> RedisClient:
        return cls(parse_url(url), timeout_s=timeout_s)

    async def call(self, *args: Arg, timeout_s: float | None = None) -> Any:
        """Send one command and return its reply (strings decoded as UTF-8), within
        `timeout_s` (default: the client's). Raises a `RedisError`."""
        limit = self.timeout_s if timeout_s is None else timeout_s
        return await self._send(pack(args), asyncio.get_running_loop().time() + limit)

    async def run_script(self, script: LuaScript, keys: Sequence[str], args: Sequence[Arg]) -> Any:
        """Run `script` with EVALSHA; if Redis does not know it (a restart, SCRIPT FLUSH),
        once more in full with EVAL (which also loads it), within the same bound."""
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        try:
            return await self._send(
                pack(("EVALSHA", script.sha, len(keys), *keys, *args)), deadline
            )
        except RedisReplyError as exc:
            if not str(exc).startswith("NOSCRIPT"):
                raise
        return await self._send(pack(("EVAL", script.source, len(keys), *keys, *args)), deadline)

    async def transaction(self, *commands: tuple[Arg, ...]) -> list[Any]:
        """Run `commands` in one MULTI/EXEC within the client's timeout and return their
        replies. An error reply raises `RedisReplyError`: one Redis refused to queue (then
        nothing ran: EXECABORT), or the first one that failed as it ran (the others ran)."""
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        connection = await self._ready(deadline)
        packed = [pack(("MULTI",)), *(pack(command) for command in commands), pack(("EXEC",))]
        # Sent without an await between them: one contiguous run on the connection.
        sent = [connection.send(command, deadline) for command in packed]
        replies = await asyncio.gather(*sent, return_exceptions=True)
        for reply in replies:
            if isinstance(reply, BaseException):
                raise reply
        results = replies[-1]
        if not isinstance(results, list):  # nil: only a WATCH aborts, and none is sent
            raise RedisReplyError("Redis did not run the transaction")
        for result in results:
            if isinstance(result, RedisReplyError):
                raise result
        return results

    async def close(self) -> None:
        """Close the connection; later calls fail with `RedisConnectionError`."""
        self._closed = True
        if self._opening is not None:
            self._opening.cancel()
        connection, self._current = self._current, None
        if connection is not None:
            connection.close()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(CLOSE_WAIT_S):
                    await connection.lost

    async def _send(self, command: bytes, deadline: float) -> Any:
        connection = self._current  # `_ready`, inlined: every quota call comes here
        if connection is None or connection.closed:
            connection = await self._connection(deadline)
        return await connection.send(command, deadline)

    async def _ready(self, deadline: float) -> RedisConnection:
        connection = self._current
        if connection is None or connection.closed:
            connection = await self._connection(deadline)
        return connection

    async def _connection(self, deadline: float) -> RedisConnection:
        if self._closed:
            raise RedisConnectionError("the Redis client is closed")
        opening = self._opening
        if opening is None:
            # Calls arriving meanwhile wait for this same opening. Bounded by the deadline of
            # the call that started it; later callers bound their own wait for it.
            opening = self._opening = asyncio.ensure_future(self._open(deadline))
            opening.add_done_callback(self._opened)
        try:
            async with asyncio.timeout_at(deadline):
                return await asyncio.shield(opening)
        except TimeoutError:
            raise RedisConnectError("no connection to Redis in time") from None

    def _opened(self, opening: asyncio.Task[RedisConnection]) -> None:
        self._opening = None
        if opening.cancelled() or opening.exception() is not None:
            return  # every waiter got the error (or gave up waiting)
        connection = opening.result()
        if self._closed:
            connection.close()
        else:
            self._current = connection

    async def _open(self, deadline: float) -> RedisConnection:
        endpoint = self.endpoint
        loop = asyncio.get_running_loop()

        def protocol() -> RedisConnection:
            return RedisConnection(loop, stall_limit_s=self._stall_limit_s)

        try:
            async with asyncio.timeout_at(deadline):
                if endpoint.unix_path is not None:
                    _, connection = await loop.create_unix_connection(protocol, endpoint.unix_path)
                else:
                    _, connection = await loop.create_connection(
                        protocol,
                        endpoint.host,
                        endpoint.port,
                        ssl=endpoint.tls,
                        server_hostname=endpoint.host if endpoint.tls is not None else None,
                    )
        except (OSError, TimeoutError) as exc:  # ssl.SSLError is an OSError
            raise RedisConnectError(f"cannot connect to Redis ({type(exc).__name__})") from exc
        hello: list[tuple[Arg, ...]] = []
        if endpoint.password is not None:
            user = (endpoint.username,) if endpoint.username else ()
            hello.append(("AUTH", *user, endpoint.password))
        if endpoint.db:
            hello.append(("SELECT", endpoint.db))
        replies = [connection.send(pack(command), deadline) for command in hello]
        try:
            for reply in replies:
                await reply
        except (RedisError, asyncio.CancelledError) as exc:
            connection.close()
            if isinstance(exc, asyncio.CancelledError):
                raise
            # Redis's own words (WRONGPASS, ...): they never repeat the password.
            raise RedisConnectError(f"Redis refused the connection's set-up: {exc}") from exc
        return connection
