"""A fault-injecting fake vLLM OpenAI server (aiohttp.web) for gateway tests.

It listens on loopback (127.0.0.1 and a random port unless told) in its own thread and event
loop, so tests talk to it, through the gateway, over real sockets (streaming timing and
disconnects are real).

Fake upstream routes (all under /v1/ so the gateway forwards them); `?t=TOKEN` keys the
gates and the events a test waits for, so tests do not see each other's traffic:
    GET  /health                 200, or 503 after `healthy = False`
    GET  /v1/models              JSON (model "fake", max_model_len 2048)
    POST /v1/chat/completions    JSON, or an SSE stream of min(4, max_tokens) words, a finish
    POST /v1/completions         event, vLLM's usage chunk when `stream_options.include_usage`,
                                 then [DONE]. Usage: prompt 3, completion = words sent.
    POST /v1/responses           the Responses API: JSON, or its SSE events (created, one
                                 output_text.delta per word, completed with the usage)
    POST /v1/messages            Anthropic's Messages API and its count_tokens (`fake_messages`)
    POST /v1/embeddings          the pooling routes: embeddings, score, rerank (`fake_pooling`)
                                 The model name picks a fault:
        fault-reset              the stream is cut after 2 events
        fault-in-band            2 words, then `data: {"error": ...}` and [DONE] (as vLLM)
        fault-garbage            SSE that is not JSON / not SSE; JSON: a body that is not JSON
        fault-no-usage           no usage anywhere
        fault-hang               never answers
        fault-hang-mid-stream    one word, then silence
        fault-500                500 text/html
        fault-context            400 vLLM error (prompt longer than the context)
        gated                    JSON: waits for `release(TOKEN)`; SSE: one word, waits, rest
    ANY  /v1/echo                JSON describing the request; hop-by-hop response headers
    POST /v1/gated-stream        one SSE event, then waits for `release(TOKEN)`, then two more
    POST /v1/bad-request         400 with vLLM's OpenAI error body
    GET  /v1/legacy-error        400 with vLLM's old flat error body
    GET  /v1/html-500            500 text/html
    GET  /v1/detail-404          404 {"detail": "Not Found"} (FastAPI's shape)
    GET  /v1/big-json            200 JSON larger than the gateway's whole-body limit
    GET  /v1/small-json          200 a small JSON object
    POST /v1/load_lora_adapter   vLLM's runtime LoRA routes over `adapters` (paths that load:
    POST /v1/unload_lora_adapter /adapters/...; others fail as a path vLLM cannot read)
    POST /v1/reset-before-headers    the connection is aborted before any response
    POST /v1/reset-mid-stream        two SSE events, then the connection is aborted
    GET  /v1/reset-mid-chunked       plain chunked body, then the connection is aborted
    POST /v1/hang                    never answers
    POST /v1/hang-mid-stream         one SSE event, then silence
Events recorded: "TOKEN:started", "TOKEN:finished", "TOKEN:cancelled"; JSON bodies of the
generation routes are kept per token (`received(TOKEN)`).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from serving.gateway.route_table import ROUTES, Route
from tests.gateway.fake_bodies import (
    CHAT_COMPLETION,
    TEXT_COMPLETION,
    VLLM_400,
    VLLM_CONTEXT_400,
    VLLM_STREAM_ERROR,
    WORDS,
    chat_chunk,
    chunk_for,
    response_object,
    responses_event,
    sse,
    usage_chunk,
)
from tests.gateway.fake_messages import count_tokens, messages
from tests.gateway.fake_pooling import embeddings, rerank, score
from tests.gateway.servers import listening_socket

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


# The fake's fault paths, served by the test gateways as free routes beside the real table
# (the proxy's behaviour is what they test, not the route table's).
_ANY = ("GET", "POST", "PUT", "PATCH", "DELETE")
FAKE_ROUTES = ROUTES.with_routes(
    *(
        Route(path, _ANY, "free")
        for path in (
            "/v1/echo", "/v1/gated-stream", "/v1/bad-request", "/v1/legacy-error",
            "/v1/redirect-to-self", "/v1/html-500", "/v1/detail-404", "/v1/big-json",
            "/v1/small-json",
            "/v1/reset-before-headers", "/v1/reset-mid-stream", "/v1/reset-mid-chunked",
            "/v1/hang", "/v1/hang-mid-stream",
        )
    )
)  # fmt: skip


class FakeUpstream:
    """A fake vLLM OpenAI server with fault routes (see the module docstring)."""

    def __init__(
        self, *, chunk_delay_s: float = 0.02, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        self.chunk_delay_s = chunk_delay_s
        self.host = host
        """Where it listens: any loopback address (engine discovery gives engines their own)."""
        self.healthy = True
        self.adapters: dict[str, str] = {}
        """LoRA adapters `/v1/models` lists beside "fake": name -> base model."""
        self.health_checks = 0
        """Requests to `/health` so far."""
        self.other_requests = 0
        """Requests to any other path so far."""
        self.port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._gates: dict[str, asyncio.Event] = {}
        self._events: set[str] = set()
        self._bodies: dict[str, list[dict[str, Any]]] = {}
        self._changed = threading.Condition()

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    @property
    def address(self) -> str:
        """host:port: the gateway's metric label for this engine."""
        return f"{self.host}:{self.port}"

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

    def requests_seen(self) -> int:
        """Requests to any path but `/health` so far."""
        return self.other_requests

    def seen(self, event: str) -> bool:
        with self._changed:
            return event in self._events

    def received(self, token: str) -> list[dict[str, Any]]:
        """The JSON bodies the generation routes got with `?t=token`, in order."""
        with self._changed:
            return list(self._bodies.get(token, []))

    # -- the server -------------------------------------------------------------------

    def keep(self, request: web.Request, body: dict[str, Any]) -> None:
        """Keep a generation route's JSON body for `received`."""
        with self._changed:
            self._bodies.setdefault(request.query.get("t", "-"), []).append(body)

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

        # vLLM sets no body limit (aiohttp's default is 1 MiB): bodies with images pass.
        @web.middleware
        async def count(request: web.Request, handler: Handler) -> web.StreamResponse:
            if request.path != "/health":
                self.other_requests += 1
            return await handler(request)

        app = web.Application(client_max_size=256 * 1024 * 1024, middlewares=[count])
        routes: list[tuple[str, str, Handler]] = [
            ("GET", "/health", self._health),
            ("GET", "/v1/models", self._models),
            ("POST", "/v1/chat/completions", self._chat),
            ("POST", "/v1/completions", self._chat),
            ("POST", "/v1/responses", self._responses),
            ("POST", "/v1/messages", lambda request: messages(self, request)),
            ("POST", "/v1/messages/count_tokens", lambda request: count_tokens(self, request)),
            ("POST", "/v1/embeddings", lambda request: embeddings(self, request)),
            ("POST", "/v1/score", lambda request: score(self, request)),
            ("POST", "/v1/rerank", lambda request: rerank(self, request)),
            ("POST", "/v2/rerank", lambda request: rerank(self, request)),
            ("*", "/v1/echo", self._echo),
            ("POST", "/v1/gated-stream", self._gated_stream),
            ("POST", "/v1/bad-request", self._bad_request),
            ("GET", "/v1/legacy-error", self._legacy_error),
            ("GET", "/v1/redirect-to-self", self._redirect_to_self),
            ("GET", "/v1/html-500", self._html_500),
            ("GET", "/v1/detail-404", self._detail_404),
            ("GET", "/v1/big-json", self._big_json),
            ("GET", "/v1/small-json", self._small_json),
            ("POST", "/v1/load_lora_adapter", self._load_adapter),
            ("POST", "/v1/unload_lora_adapter", self._unload_adapter),
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
        sock = listening_socket(self.host, self.port)
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
            except (asyncio.CancelledError, ConnectionResetError):
                # Its client closed the request: the handler is cancelled when aiohttp sees the
                # connection go first, its next write fails when the write comes first.
                self._record(f"{token}:cancelled")
                raise
            self._record(f"{token}:finished")
            return response

        return tracked

    async def _health(self, request: web.Request) -> web.StreamResponse:
        self.health_checks += 1
        return web.json_response({}, status=200 if self.healthy else 503)

    async def _redirect_to_self(self, request: web.Request) -> web.StreamResponse:
        # What vLLM (Starlette) answers for a path with an extra trailing slash.
        raise web.HTTPTemporaryRedirect(f"{self.url}/v1/models?x=1")

    async def _models(self, request: web.Request) -> web.StreamResponse:
        models: list[dict[str, object]] = [
            {"id": "fake", "object": "model", "max_model_len": 2048, "parent": None}
        ]
        for name, base in self.adapters.items():
            models.append({"id": name, "object": "model", "max_model_len": None, "parent": base})
        return web.json_response({"object": "list", "data": models})

    async def _load_adapter(self, request: web.Request) -> web.StreamResponse:
        if request.content_type != "application/json":  # vLLM's validate_json_request
            return web.json_response({"error": {"message": "Unsupported Media Type"}}, status=400)
        body = await request.json()
        name, path = body["lora_name"], body["lora_path"]
        if name in self.adapters:
            message = f"The lora adapter '{name}' has already been loaded."
            return web.json_response({"error": {"message": message, "code": 400}}, status=400)
        if not path.startswith("/adapters/"):
            message = f"Loading lora {name} failed: No adapter found for {path}"
            return web.json_response({"error": {"message": message, "code": 400}}, status=400)
        self.adapters[name] = "fake"
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")

    async def _unload_adapter(self, request: web.Request) -> web.StreamResponse:
        if request.content_type != "application/json":
            return web.json_response({"error": {"message": "Unsupported Media Type"}}, status=400)
        name = (await request.json())["lora_name"]
        if self.adapters.pop(name, None) is None:
            message = f"The lora adapter '{name}' cannot be found."
            return web.json_response({"error": {"message": message, "code": 404}}, status=404)
        return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")

    async def _small_json(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"object": "list", "data": [{"id": "x"}]})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        token = request.query.get("t", "-")
        with self._changed:
            self._bodies.setdefault(token, []).append(body)
        model = body.get("model")
        chat = request.path.endswith("/chat/completions")
        if model in _FAULTS:
            return await _FAULTS[model](self, request, body)
        if model == "gated" and not body.get("stream"):
            await self._gate(token).wait()
        if not body.get("stream"):
            reply = dict(CHAT_COMPLETION if chat else TEXT_COMPLETION)
            if model == "fault-no-usage":
                del reply["usage"]
            return web.json_response(reply)
        response = await self._start_sse(request)
        words = WORDS[: min(len(WORDS), body.get("max_tokens") or len(WORDS))]
        for index, word in enumerate(words):
            await response.write(sse(chunk_for(chat, index, word)))
            await asyncio.sleep(self.chunk_delay_s)
            if index == 0 and model == "gated":
                await self._gate(token).wait()
            if index == 0 and model == "fault-hang-mid-stream":
                await asyncio.sleep(3600)
            if index == 1 and model in ("fault-reset", "fault-in-band"):
                if model == "fault-reset":
                    assert request.transport is not None
                    request.transport.abort()
                    await asyncio.sleep(10)
                await response.write(sse(VLLM_STREAM_ERROR))
                await response.write(b"data: [DONE]\n\n")
                return response
        await response.write(sse(chunk_for(chat, len(words), "", "stop")))
        options = body.get("stream_options") or {}
        if options.get("include_usage") and model != "fault-no-usage":
            await response.write(sse(usage_chunk(chat, completion_tokens=len(words))))
        await response.write(b"data: [DONE]\n\n")
        return response

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        words = WORDS[: min(len(WORDS), body.get("max_output_tokens") or len(WORDS))]
        if not body.get("stream"):
            return web.json_response(response_object("completed", words))
        response = await self._start_sse(request)
        await response.write(
            responses_event(
                "response.created", response=response_object("in_progress", [], usage=False)
            )
        )
        for word in words:
            await response.write(responses_event("response.output_text.delta", delta=word))
            await asyncio.sleep(self.chunk_delay_s)
        completed = response_object("completed", words)
        await response.write(responses_event("response.completed", response=completed))
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

    # -- faults picked by model name ------------------------------------------------------

    async def _fault_garbage(
        self, request: web.Request, body: dict[str, Any]
    ) -> web.StreamResponse:
        if not body.get("stream"):
            return web.Response(text="this is not json", content_type="application/json")
        response = await self._start_sse(request)
        await response.write(b"data: {not json\n\n")
        await response.write(b"garbage without a field\n\n")
        await response.write(b"data: [DONE]\n\n")
        return response

    async def _fault_hang(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    async def _fault_500(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        return await self._html_500(request)

    async def _fault_context(
        self, request: web.Request, body: dict[str, Any]
    ) -> web.StreamResponse:
        return web.json_response(VLLM_CONTEXT_400, status=400)


_Fault = Callable[[FakeUpstream, web.Request, dict[str, Any]], Awaitable[web.StreamResponse]]
_FAULTS: dict[str, _Fault] = {
    "fault-garbage": FakeUpstream._fault_garbage,
    "fault-hang": FakeUpstream._fault_hang,
    "fault-500": FakeUpstream._fault_500,
    "fault-context": FakeUpstream._fault_context,
}
