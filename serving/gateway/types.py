"""ASGI type aliases, as in Starlette's `types.py`.

The gateway is plain ASGI (no framework), so these are the only types its callables share.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]

Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# ASGI header lists: lower-case names, raw byte values.
RawHeaders = list[tuple[bytes, bytes]]
