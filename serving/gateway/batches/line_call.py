"""One batch line run through the same code as an interactive request
(`Completions.handle`: admission, reserve, the fair queue in its lowest class, forward,
settle), with an in-memory receive/send pair that captures the answer.

    result = await call_line(completions, "chat", caller, body, "/v1/chat/completions",
                             request_id="5f0c...", observe=record_metrics, retry_after_s=1)

The line's `RequestRecord` is observed like an interactive request's (metrics, usage
ledger), so its tokens count for the key exactly as the same request would.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from serving.gateway.api_dialect import OPENAI
from serving.gateway.auth import Caller
from serving.gateway.completions import Completions
from serving.gateway.errors import GatewayError
from serving.gateway.fair_queue import lowest_class
from serving.gateway.metrics import RequestRecord
from serving.gateway.proxy import ProxyRequest
from serving.gateway.quota import QuotaStoreUnavailable
from serving.gateway.request_fields import Kind
from serving.gateway.types import Message

# Answers that say "not now" rather than "not this request": the line waits and retries.
RETRY_STATUSES = frozenset({429, 503})
_HEADERS = [(b"content-type", b"application/json")]


@dataclass(slots=True)
class LineResult:
    status: int
    body: bytes
    request_id: str
    retry_after_s: float | None = None
    """Set for a refusal worth retrying (429, 503): when to try again."""


@dataclass(slots=True)
class _Capture:
    status: int = 0
    body: bytearray = field(default_factory=bytearray)

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        elif message["type"] == "http.response.body":
            self.body += message.get("body", b"")


async def _never_gone() -> Message:
    """A batch line has no client to go away: waits until the line's task is cancelled."""
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


async def call_line(
    completions: Completions,
    kind: Kind,
    caller: Caller,
    body: bytes,
    path: str,
    *,
    request_id: str,
    observe: Callable[[RequestRecord], None],
    retry_after_s: float,
) -> LineResult:
    """`request_id` is the line's run's id, sent to the engine as its x-request-id."""
    rid = request_id.encode()
    record = RequestRecord(time.perf_counter())
    record.key = caller.key_id
    capture = _Capture()
    request = ProxyRequest("POST", path.encode(), _HEADERS, body, rid, dialect=OPENAI)
    retry: float | None = None
    try:
        with lowest_class():
            await completions.handle(kind, caller, request, _never_gone, capture.send, record)
    except QuotaStoreUnavailable:
        capture.status, retry = 503, retry_after_s
        capture.body = bytearray(b'{"error":{"message":"quota store unavailable"}}')
    except GatewayError as error:
        capture.status = record.status = OPENAI.status(error)
        capture.body = bytearray(OPENAI.body(error))
        if capture.status in RETRY_STATUSES:
            retry = error.retry_after_s if error.retry_after_s is not None else retry_after_s
    finally:
        observe(record)
    return LineResult(capture.status, bytes(capture.body), rid.decode(), retry)
