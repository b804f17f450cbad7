"""A response's head sent together with its first body write.

    cork_head(cycle)    # in the protocol, right after uvicorn made the request's cycle

uvicorn writes the status line and headers, then the body, as two writes (two syscalls, two
TCP segments per JSON answer); the cycle's transport is wrapped so that the head waits for
the next write and goes out with it. Bodies, chunked streams, HEAD, 100 Continue and access
logs stay uvicorn's own code.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import RequestResponseCycle


def cork_head(cycle: RequestResponseCycle, loop: asyncio.AbstractEventLoop) -> None:
    """Wrap the transport of uvicorn's new request cycle (before its task first runs)."""
    cycle.transport = HeadCork(cycle.transport, loop, cycle)  # type: ignore[assignment]


class HeadCork:
    """The transport of one request's cycle: its first write (the response head, or a 100
    Continue) waits for the next one and goes out with it, at the latest at the end of the
    event loop's current turn (a stream whose first chunk comes later) or before the
    connection closes. Once the head is out, `owner` (the cycle) gets its transport back,
    so a stream's chunks do not pass through this wrapper."""

    __slots__ = ("_held", "_loop", "_owner", "_transport")

    def __init__(
        self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop, owner: Any = None
    ) -> None:
        self._transport = transport
        self._held: bytes | None = None
        self._loop: asyncio.AbstractEventLoop | None = loop
        self._owner = owner

    def write(self, data: bytes) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.writelines((held, data))
            self._uncork()
        elif self._loop is not None:  # the first write of the response: its head
            self._loop.call_soon(self.flush)
            self._loop = None
            self._held = data
        else:
            self._transport.write(data)

    def flush(self) -> None:
        held = self._held
        if held is not None:
            self._held = None
            if not self._transport.is_closing():
                self._transport.write(held)
            self._uncork()

    def _uncork(self) -> None:
        owner, self._owner = self._owner, None
        if owner is not None and owner.transport is self:
            owner.transport = self._transport

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        # Whatever else uvicorn may ask of a transport (get_extra_info, ...).
        return getattr(self._transport, name)
