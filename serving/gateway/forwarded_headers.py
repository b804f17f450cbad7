"""Which headers cross the gateway, and the request id every response carries.

Towards the upstream only the headers the route table lists pass (`UPSTREAM_HEADERS`); the
hop client sets host and content-length itself. Towards the client, hop-by-hop headers
(RFC 9110 section 7.6.1), which describe one connection, are dropped together with any header
the `Connection` header names, and so are the framing headers the ASGI server sets itself.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable

from serving.gateway.route_table import UPSTREAM_HEADERS
from serving.gateway.types import RawHeaders

HOP_BY_HOP: frozenset[bytes] = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)

REQUEST_ID = b"x-request-id"

# Set again by the ASGI server (framing, date) or by the gateway (x-request-id); `server` is
# not sent at all (server.build_server).
_NOT_RETURNED: frozenset[bytes] = HOP_BY_HOP | {
    b"content-length",
    b"date",
    b"server",
    REQUEST_ID,
}

_SANE_REQUEST_ID = re.compile(rb"[A-Za-z0-9._:-]{1,128}")
_ids = random.Random()  # seeded from the OS once; each process (replica) gets its own stream


def request_id(client_value: bytes | None) -> bytes:
    """The client's `x-request-id` if it is short and plain, else a fresh random one."""
    if client_value is not None and _SANE_REQUEST_ID.fullmatch(client_value):
        return client_value
    # 128 random bits like a uuid4, without its getrandom() system call per request (which
    # costs tens of microseconds in sandboxed VMs); ids need to be unique, not secret.
    return b"%032x" % _ids.getrandbits(128)


def upstream_request_headers(headers: RawHeaders, request_id: bytes) -> bytes:
    """The client's request headers as the hop client sends them to the upstream: the
    `name: value\r\n` lines of those the route table lets through (`UPSTREAM_HEADERS`:
    never credentials, hop-by-hop headers or vLLM's own control headers), then the request
    id."""
    forwarded = [
        b"%s: %s\r\n" % (name, value) for name, value in headers if name.lower() in UPSTREAM_HEADERS
    ]
    forwarded.append(b"x-request-id: %s\r\n" % request_id)
    return b"".join(forwarded)


def client_response_headers(
    raw_headers: Iterable[tuple[bytes, bytes]], request_id: bytes
) -> RawHeaders:
    """The upstream's response headers (raw, any case) as the gateway returns them."""
    returned: RawHeaders = []
    tokens: list[bytes] = []
    for name, value in raw_headers:
        lower = name.lower()
        if lower in _NOT_RETURNED:
            if lower == b"connection":  # it names more headers to drop (rare)
                tokens.extend(token.strip().lower() for token in value.split(b","))
            continue
        returned.append((lower, value))
    if tokens:
        returned = [pair for pair in returned if pair[0] not in tokens]
    returned.append((REQUEST_ID, request_id))
    return returned
