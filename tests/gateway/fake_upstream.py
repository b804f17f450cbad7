"""A fault-injecting fake vLLM OpenAI server (aiohttp.web) for gateway tests.

It listens on 127.0.0.1 on a random port in its own thread and event loop, so tests talk
to it, through the gateway, over real sockets (streaming timing and disconnects are real).

Fake upstream routes (all under /v1/ so the gateway forwards them); `?t=TOKEN` keys the
gates and the events a test waits for, so tests do not see each other's traffic:
    GET  /health                 200, or 503 after `healthy = False`
    GET  /v1/models              JSON
    POST /v1/chat/completions    JSON, or an SSE stream of 6 events when "stream"; with
                                 model "fault-reset" the stream is cut after 2 events
    ANY  /v1/echo                JSON describing the request; hop-by-hop response headers
    POST /v1/gated-stream        one SSE event, then waits for `release(TOKEN)`, then two more
    POST /v1/bad-request         400 with vLLM's OpenAI error body
    GET  /v1/legacy-error        400 with vLLM's old flat error body
    GET  /v1/html-500            500 text/html
    GET  /v1/detail-404          404 {"detail": "Not Found"} (FastAPI's shape)
    GET  /v1/big-json            200 JSON larger than the gateway's whole-body limit
    POST /v1/reset-before-headers    the connection is aborted before any response
    POST /v1/reset-mid-stream        two SSE events, then the connection is aborted
    GET  /v1/reset-mid-chunked       plain chunked body, then the connection is aborted
    POST /v1/hang                    never answers
    POST /v1/hang-mid-stream         one SSE event, then silence
Events recorded: "TOKEN:started", "TOKEN:finished", "TOKEN:cancelled".
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from tests.gateway.servers import listening_socket

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def sse(payload: object) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def chat_chunk(index: int, content: str, finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "fake",
        "choices": [
            {
                "index": 0,
                "delta": {"role": "assistant", "content": content}
                if index == 0
                else {"content": content},
                "finish_reason": finish,
            }
        ],
    }


CHAT_COMPLETION: dict[str, Any] = {
    "id": "chatcmpl-fake",
    "object": "chat.completion",
    "created": 0,
    "model": "fake",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "hello there"},
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
}

VLLM_400 = {
    "error": {
        "message": "max_tokens must be at least 1, got -1.",
        "type": "BadRequestError",
        "param": "max_tokens",
        "code": 400,
    }
}


class FakeUpstream:
    """A fake vLLM OpenAI server with fault routes (see the module docstring)."""

    def __init__(self, *, chunk_delay_s: float = 0.02) -> None:
        self.chunk_delay_s = chunk_delay_s
        self.healthy = True
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._gates: dict[str, asyncio.Event] = {}
        self._events: set[str] = set()
        self._changed = threading.Condition()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- control from the test thread -------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="fake-upstream", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("fake upstream did not start")

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(10)

    def release(self, token: str) -> None:
        """Open the gate a `/v1/gated-stream?t=token` handler waits on."""
        loop = self._loop
        assert loop is not None
        loop.call_soon_threadsafe(self._gate(token).set)

    def wait_for(self, event: str, timeout: float) -> bool:
        """True once `event` (e.g. "TOKEN:cancelled") was recorded, False after timeout."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while event not in self._events:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
            return True

    def seen(self, event: str) -> bool:
        with self._changed:
            return event in self._events

    # -- the server -------------------------------------------------------------------

    def _record(self, event: str) -> None:
        with self._changed:
            self._events.add(event)
            self._changed.notify_all()

    def _gate(self, token: str) -> asyncio.Event:
        return self._gates.setdefault(token, asyncio.Event())

    def _run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        app = web.Application()
        routes: list[tuple[str, str, Handler]] = [
            ("GET", "/health", self._health),
            ("GET", "/v1/models", self._models),
            ("POST", "/v1/chat/completions", self._chat),
            ("*", "/v1/echo", self._echo),
            ("POST", "/v1/gated-stream", self._gated_stream),
            ("POST", "/v1/bad-request", self._bad_request),
            ("GET", "/v1/legacy-error", self._legacy_error),
            ("GET", "/v1/html-500", self._html_500),
            ("GET", "/v1/detail-404", self._detail_404),
            ("GET", "/v1/big-json", self._big_json),
            ("POST", "/v1/reset-before-headers", self._reset_before_headers),
            ("POST", "/v1/reset-mid-stream", self._reset_mid_stream),
            ("GET", "/v1/reset-mid-chunked", self._reset_mid_chunked),
            ("POST", "/v1/hang", self._hang),
            ("POST", "/v1/hang-mid-stream", self._hang_mid_stream),
        ]
        for method, path, handler in routes:
            app.router.add_route(method, path, self._tracked(handler))
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await runner.setup()
        sock = listening_socket()
        site = web.SockSite(runner, sock)
        await site.start()
        self.port = sock.getsockname()[1]
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()

    def _tracked(self, handler: Handler) -> Handler:
        async def tracked(request: web.Request) -> web.StreamResponse:
            token = request.query.get("t", "-")
            self._record(f"{token}:started")
            try:
                response = await handler(request)
            except asyncio.CancelledError:
                self._record(f"{token}:cancelled")
                raise
            self._record(f"{token}:finished")
            return response

        return tracked

    async def _health(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({}, status=200 if self.healthy else 503)

    async def _models(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"object": "list", "data": [{"id": "fake", "object": "model"}]})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if not body.get("stream"):
            return web.json_response(CHAT_COMPLETION)
        response = await self._start_sse(request)
        words = ["one", " two", " three", " four"]
        for index, word in enumerate(words):
            await response.write(sse(chat_chunk(index, word)))
            await asyncio.sleep(self.chunk_delay_s)
            if body.get("model") == "fault-reset" and index == 1:
                assert request.transport is not None
                request.transport.abort()
                await asyncio.sleep(10)
        await response.write(sse(chat_chunk(len(words), "", "stop")))
        await response.write(b"data: [DONE]\n\n")
        return response

    async def _echo(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        described = {
            "method": request.method,
            "path_qs": request.raw_path,
            "headers": [[name.lower(), value] for name, value in request.headers.items()],
            "body": body.decode(),
        }
        response = web.json_response(described)
        response.headers["Connection"] = "x-hop-named"
        response.headers["X-Hop-Named"] = "drop me"
        response.headers["Keep-Alive"] = "timeout=5"
        response.headers["Proxy-Authenticate"] = "Basic"
        response.headers["X-Request-Id"] = "upstream-id"
        response.headers["X-Custom"] = "kept"
        return response

    async def _start_sse(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        return response

    async def _gated_stream(self, request: web.Request) -> web.StreamResponse:
        response = await self._start_sse(request)
        await response.write(sse(chat_chunk(0, "first")))
        await self._gate(request.query["t"]).wait()
        await response.write(sse(chat_chunk(1, " second")))
        await response.write(sse(chat_chunk(2, "", "stop")))
        await response.write(b"data: [DONE]\n\n")
        return response

    async def _bad_request(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(VLLM_400, status=400)

    async def _legacy_error(self, request: web.Request) -> web.StreamResponse:
        flat = {"object": "error", "message": "bad", "type": "BadRequestError", "code": 400}
        return web.json_response(flat, status=400)

    async def _html_500(self, request: web.Request) -> web.StreamResponse:
        return web.Response(
            status=500,
            text="<html><body>Internal error at 10.0.0.7</body></html>",
            content_type="text/html",
        )

    async def _detail_404(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"detail": "Not Found"}, status=404)

    async def _big_json(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"data": "x" * (2 * 1024 * 1024)})

    async def _reset_before_headers(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        assert request.transport is not None
        request.transport.abort()
        await asyncio.sleep(10)  # cancelled once aiohttp sees the connection gone
        raise AssertionError("unreachable")

    async def _reset_mid_stream(self, request: web.Request) -> web.StreamResponse:
        response = await self._start_sse(request)
        await response.write(sse(chat_chunk(0, "one")))
        await response.write(sse(chat_chunk(1, " two")))
        await asyncio.sleep(self.chunk_delay_s)
        assert request.transport is not None
        request.transport.abort()
        await asyncio.sleep(10)
        raise AssertionError("unreachable")

    async def _reset_mid_chunked(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        await response.prepare(request)
        await response.write(b"partial body")
        await asyncio.sleep(self.chunk_delay_s)
        assert request.transport is not None
        request.transport.abort()
        await asyncio.sleep(10)
        raise AssertionError("unreachable")

    async def _hang(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    async def _hang_mid_stream(self, request: web.Request) -> web.StreamResponse:
        response = await self._start_sse(request)
        await response.write(sse(chat_chunk(0, "one")))
        await asyncio.sleep(3600)
        return response
