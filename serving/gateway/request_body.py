"""Reading a request's body, and what the gateway knows of it before reading it."""

from __future__ import annotations

from serving.gateway.errors import BodyTooLargeError, ClientGone
from serving.gateway.types import Receive

# Metered bodies larger than this are read only after the key's concurrency and requests/min
# were looked at (a store call, where reading and parsing the body would cost more).
PRECHECK_BODY_BYTES = 64 * 1024


def worth_precheck(content_length: bytes | None) -> bool:
    """A body worth the quota store's look before it is read (chunked ones included)."""
    if content_length is None or not content_length.isdigit():
        return True
    return int(content_length) > PRECHECK_BODY_BYTES


def is_plain_path(path: str) -> bool:
    """False for paths with `.` or `..` segments, which some servers would normalise."""
    return "/." not in path or all(part not in (".", "..") for part in path.split("/"))


async def read_body(receive: Receive, limit: int, content_length: bytes | None) -> bytes:
    """The whole request body, or `BodyTooLargeError` as soon as it exceeds `limit`.

    The time a body may take is the server's to enforce (`server.deadline_protocol`), which
    costs nothing per request, unlike a timeout around this loop.
    """
    if content_length is not None and content_length.isdigit() and int(content_length) > limit:
        raise _too_large(limit)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone()
        chunk: bytes = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit:
                raise _too_large(limit)
            chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _too_large(limit: int) -> BodyTooLargeError:
    return BodyTooLargeError(f"Request body is larger than {limit} bytes.")
