"""One server-sent event's data (`event_data`), and that data as JSON (`json_value`)."""

from __future__ import annotations

from typing import Any

import orjson


def event_data(event: bytes) -> bytes:
    """The data of one SSE event: its `data:` lines joined, as SSE defines it."""
    if b"\n" in event.rstrip():
        return b"\n".join(
            line[5:] for line in event.splitlines() if line.startswith(b"data:")
        ).strip()
    return event[5:].strip() if event.startswith(b"data:") else b""


def json_value(payload: bytes) -> Any:
    """The JSON value of `payload`, or None when it is not JSON."""
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
