"""A fast fake OpenAI server: the upstream every path of the benchmark ends at.

    python -m bench.gateway_overhead.upstream --port 8101      # 127.0.0.1 only

`POST /v1/chat/completions` answers at once (no think time) with 20 completion tokens:
- JSON: one precomputed body with its `content-length`;
- `"stream": true`: 20 delta chunks (the last with `finish_reason`), a usage chunk when the
  request asks for `stream_options.include_usage` (as vLLM does; with `continuous_usage_stats`
  every delta chunk carries the usage so far, as the gateway asks), then `data: [DONE]`; each
  event is its own HTTP chunk and its own socket write, with a yield to the event loop in
  between, so a proxy sees chunks arrive one by one as it would from vLLM.
`GET /health` and `GET /v1/models` answer 200; anything else is 404.

Why a raw asyncio protocol with httptools on uvloop rather than aiohttp.web: the upstream
shares a core with the load generator, so every microsecond it spends is taken from the
load (it spends about a third of aiohttp.web's CPU per JSON request).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import time
from typing import cast

import httptools
import uvloop

COMPLETION_TOKENS = 20
PROMPT_TOKENS = 12
MODEL = "bench-model"

_CREATED = int(time.time())
_ID = "chatcmpl-bench0000000000000000"
_USAGE = {
    "prompt_tokens": PROMPT_TOKENS,
    "completion_tokens": COMPLETION_TOKENS,
    "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS,
}


def _dumps(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _response(status: bytes, content_type: bytes, body: bytes) -> bytes:
    return (
        b"HTTP/1.1 " + status + b"\r\ncontent-type: " + content_type + b"\r\ncontent-length: "
        b"" + str(len(body)).encode() + b"\r\n\r\n" + body
    )


COMPLETION_BODY = _dumps(
    {
        "id": _ID,
        "object": "chat.completion",
        "created": _CREATED,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "tok " * COMPLETION_TOKENS},
                "finish_reason": "length",
            }
        ],
        "usage": _USAGE,
    }
)
JSON_RESPONSE = _response(b"200 OK", b"application/json", COMPLETION_BODY)
HEALTH_RESPONSE = _response(b"200 OK", b"application/json", b"{}")
MODELS_RESPONSE = _response(
    b"200 OK",
    b"application/json",
    _dumps({"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "bench"}]}),
)
NOT_FOUND_RESPONSE = _response(
    b"404 Not Found",
    b"application/json",
    _dumps({"error": {"message": "not found", "type": "invalid_request_error"}}),
)
STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)


def _chunk(event: dict[str, object] | str) -> bytes:
    data = event.encode() if isinstance(event, str) else _dumps(event)
    payload = b"data: " + data + b"\n\n"
    return f"{len(payload):x}\r\n".encode() + payload + b"\r\n"


def _delta(index: int, *, running: bool = False) -> dict[str, object]:
    last = index == COMPLETION_TOKENS - 1
    delta = {"role": "assistant", "content": "tok "} if index == 0 else {"content": "tok "}
    choice = {"index": 0, "delta": delta, "finish_reason": "length" if last else None}
    event: dict[str, object] = {
        "id": _ID,
        "object": "chat.completion.chunk",
        "created": _CREATED,
        "model": MODEL,
        "choices": [choice],
    }
    if running:
        event["usage"] = {
            "prompt_tokens": PROMPT_TOKENS,
            "total_tokens": PROMPT_TOKENS + index + 1,
            "completion_tokens": index + 1,
        }
    return event


DELTA_CHUNKS = tuple(_chunk(_delta(i)) for i in range(COMPLETION_TOKENS))
RUNNING_DELTA_CHUNKS = tuple(_chunk(_delta(i, running=True)) for i in range(COMPLETION_TOKENS))
USAGE_CHUNK = _chunk(
    {
        "id": _ID,
        "object": "chat.completion.chunk",
        "created": _CREATED,
        "model": MODEL,
        "choices": [],
        "usage": _USAGE,
    }
)
DONE_CHUNKS = _chunk("[DONE]") + b"0\r\n\r\n"


class UpstreamProtocol(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection; requests on it are answered in order."""

    def __init__(self) -> None:
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._url = b""
        self._body: list[bytes] = []
        self._busy: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        if self._busy is not None:
            self._busy.cancel()

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            if self._transport is not None:
                self._transport.close()

    # httptools callbacks
    def on_message_begin(self) -> None:
        self._url = b""
        self._body = []

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        transport = self._transport
        if transport is None:
            return
        method = self._parser.get_method()
        if method == b"POST" and self._url == b"/v1/chat/completions":
            request = json.loads(b"".join(self._body) or b"{}")
            if request.get("stream"):
                options = request.get("stream_options") or {}
                usage = bool(options.get("include_usage"))
                running = usage and bool(options.get("continuous_usage_stats"))
                chunks = RUNNING_DELTA_CHUNKS if running else DELTA_CHUNKS
                self._busy = asyncio.ensure_future(self._stream(transport, usage, chunks))
                return
            transport.write(JSON_RESPONSE)
        elif method == b"GET" and self._url == b"/health":
            transport.write(HEALTH_RESPONSE)
        elif method == b"GET" and self._url == b"/v1/models":
            transport.write(MODELS_RESPONSE)
        else:
            transport.write(NOT_FOUND_RESPONSE)

    async def _stream(
        self, transport: asyncio.Transport, usage: bool, chunks: tuple[bytes, ...]
    ) -> None:
        transport.write(STREAM_HEAD)
        for chunk in chunks:
            await asyncio.sleep(0)
            if transport.is_closing():
                return
            transport.write(chunk)
        await asyncio.sleep(0)
        if usage:
            transport.write(USAGE_CHUNK)
        transport.write(DONE_CHUNKS)
        self._busy = None


async def serve(port: int) -> None:
    """Serve on 127.0.0.1:`port` until SIGINT or SIGTERM (set here: a background start may
    have left SIGINT ignored)."""
    loop = asyncio.get_running_loop()
    server = await loop.create_server(UpstreamProtocol, "127.0.0.1", port, backlog=1024)
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    async with server:
        await stop.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    uvloop.run(serve(args.port))


if __name__ == "__main__":
    main()
