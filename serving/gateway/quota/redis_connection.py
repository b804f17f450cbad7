"""One pipelined connection to Redis: an asyncio Protocol, replies parsed by hiredis' C reader.

    reply = await connection.send(hiredis.pack_command(("PING",)), deadline)   # "PONG"

`redis_client` opens these, says hello and opens a new one when one is lost. The rules:
- Pipelined: a command is sent whatever still waits; Redis answers in order, so replies go to
  the waiting commands first in, first out.
- A command past its deadline fails (`RedisTimeoutError`); it, like one whose caller was
  cancelled, keeps its place in line: its late reply is read and dropped.
- A connection owing replies that reads nothing for `stall_limit_s` fails them and is closed.
- An error reply fails its own command only (`RedisReplyError`); bytes that are not RESP, or a
  reply nobody asked for, close the connection. Every failure is a `RedisError` (its tree is in
  `serving/gateway/failures.py`).
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from typing import Any

import hiredis

from serving.gateway.failures import GatewayException


class RedisError(GatewayException):
    """A failed command."""


class RedisConnectionError(RedisError, ConnectionError):
    """The connection is gone (lost, closed or stalled); commands still waiting on it will get
    no reply."""


class RedisConnectError(RedisConnectionError):
    """No connection could be opened (so the command was never sent)."""


class RedisTimeoutError(RedisError, TimeoutError):
    """No reply came by the command's deadline."""


class RedisReplyError(RedisError):
    """Redis answered the command with an error reply (`NOSCRIPT ...`, `ERR ...`)."""


class RedisProtocolError(RedisError):
    """What came back is not RESP."""


# (future, deadline, sent at): one command waiting for its reply.
_Waiting = tuple["asyncio.Future[Any]", float, float]


class RedisConnection(asyncio.Protocol):
    """The protocol of one Redis socket; see the module docstring for its rules."""

    def __init__(self, loop: asyncio.AbstractEventLoop, *, stall_limit_s: float) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._stall_limit_s = stall_limit_s
        self._reader = hiredis.Reader(
            encoding="utf-8", replyError=RedisReplyError, protocolError=RedisProtocolError
        )
        self._waiting: deque[_Waiting] = deque()
        self._outgoing: list[bytes] = []
        self._last_read = loop.time()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self.lost: asyncio.Future[None] = loop.create_future()
        """Done once the socket is shut."""

    def send(self, command: bytes, deadline: float) -> asyncio.Future[Any]:
        """Write one packed command (`hiredis.pack_command`); its reply arrives in the
        returned future, or `RedisTimeoutError` at `deadline`."""
        transport = self.transport
        if transport is None or self.closed:
            raise RedisConnectionError("the connection to Redis is closed")
        future = self.loop.create_future()
        self._waiting.append((future, deadline, self.loop.time()))
        if deadline < self._timer_at:
            self._arm(deadline)
        outgoing = self._outgoing
        outgoing.append(command)
        if len(outgoing) == 1:
            self.loop.call_soon(self._write)
        return future

    def _write(self) -> None:
        """Write what the commands of this loop iteration queued, in one write at its end: one
        system call, and one read for Redis, for all the requests that reached Redis at once."""
        outgoing, self._outgoing = self._outgoing, []
        if self.transport is not None and not self.closed:
            self.transport.write(outgoing[0] if len(outgoing) == 1 else b"".join(outgoing))

    @property
    def waiting(self) -> int:
        """Commands written and not answered yet (those past their deadline included)."""
        return len(self._waiting)

    def close(
        self,
        why: str = "the connection to Redis was closed",
        kind: type[RedisError] = RedisConnectionError,
    ) -> None:
        """Close the socket; what still waits fails with `kind(why)`."""
        if self.closed:
            return
        self.closed = True
        self._fail_all(why, kind)
        if self.transport is not None:
            self.transport.close()

    # -- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        self._last_read = self.loop.time()
        reader = self._reader
        reader.feed(data)
        waiting = self._waiting
        while True:
            try:
                reply = reader.gets()
            except (RedisProtocolError, ValueError) as exc:  # ValueError: not UTF-8
                self.close(f"Redis sent bytes that are not RESP ({exc})", RedisProtocolError)
                return
            if reply is False:  # RESP2 has no false: this means "no whole reply yet"
                return
            if not waiting:
                self.close("Redis sent a reply nobody asked for", RedisProtocolError)
                return
            future = waiting.popleft()[0]
            if future.done():
                continue  # timed out or cancelled: its late reply is dropped, in its turn
            if isinstance(reply, RedisReplyError):
                future.set_exception(reply)
            else:
                future.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.lost.done():
            self.lost.set_result(None)
        self._fail_all("the connection to Redis was lost", RedisConnectionError)

    def eof_received(self) -> bool | None:
        return None  # close the transport; connection_lost then fails what waits

    # -- deadlines --------------------------------------------------------------------------

    def _arm(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_at(at, self._on_timer)
        self._timer_at = at

    def _on_timer(self) -> None:
        """One timer per connection, not per command: armed for the earliest deadline and
        re-armed only when it fires (commands share one timeout, so under load it fires about
        once per timeout)."""
        self._timer, self._timer_at = None, math.inf
        now = self.loop.time()
        earliest = math.inf
        expired = False
        for future, deadline, _ in self._waiting:
            if future.done():
                continue
            if deadline <= now:
                future.set_exception(RedisTimeoutError("Redis did not answer in time"))
                expired = True
            elif deadline < earliest:
                earliest = deadline
        if expired and self._waiting:
            # A server behind a dead network path never answers, and may never reset either.
            owed_since = max(self._last_read, self._waiting[0][2])
            if now - owed_since >= self._stall_limit_s:
                self.close("Redis sent nothing for too long", RedisConnectionError)
                return
        if earliest < math.inf:
            self._arm(earliest)

    def _fail_all(self, why: str, kind: type[RedisError]) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer, self._timer_at = None, math.inf
        waiting, self._waiting = self._waiting, deque()
        for future, _, _ in waiting:
            if not future.done():
                # One exception object per waiter: raising a shared one in several tasks
                # would pile their tracebacks onto it.
                future.set_exception(kind(why))
