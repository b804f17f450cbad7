"""Which headers cross the gateway, and the request id every response carries.

Hop-by-hop headers (RFC 9110 section 7.6.1) describe one connection, so they are dropped in
both directions, together with any header the `Connection` header names. Towards the upstream
the gateway also drops the caller's credentials and the headers the hop client sets itself;
towards the client it drops the framing headers the ASGI server sets itself.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable

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

# Set by the hop client (host, content-length), by the gateway (x-request-id), or not
# forwarded on purpose (authorization: the upstream never sees a client's key; expect:
# the ASGI server answers 100-continue itself).
_NOT_FORWARDED: frozenset[bytes] = HOP_BY_HOP | {
    b"host",
    b"authorization",
    b"content-length",
    b"expect",
    REQUEST_ID,
}

# Set again by the ASGI server (framing, date, server) or by the gateway (x-request-id).
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


def _connection_tokens(headers: Iterable[tuple[bytes, bytes]]) -> frozenset[bytes]:
    tokens: set[bytes] = set()
    for name, value in headers:
        if name.lower() == b"connection":
            tokens.update(token.strip().lower() for token in value.split(b","))
    return frozenset(tokens)


def upstream_request_headers(headers: RawHeaders, request_id: bytes) -> bytes:
    """The client's request headers as the hop client sends them to the upstream: the
    `name: value\r\n` lines of what is forwarded, then the request id."""
    forwarded: list[bytes] = []
    for name, value in headers:
        lower = name.lower()
        if lower in _NOT_FORWARDED:
            if lower == b"connection":  # it names more headers to drop (rare)
                return _upstream_request_headers_listed(headers, request_id)
            continue
        forwarded.append(b"%s: %s\r\n" % (name, value))
    forwarded.append(b"x-request-id: %s\r\n" % request_id)
    return b"".join(forwarded)


def _upstream_request_headers_listed(headers: RawHeaders, request_id: bytes) -> bytes:
    drop = _NOT_FORWARDED | _connection_tokens(headers)
    forwarded = [
        b"%s: %s\r\n" % (name, value) for name, value in headers if name.lower() not in drop
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
