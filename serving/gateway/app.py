"""The gateway as one plain ASGI application.

    app = create_app(settings)     # run it with uvicorn, lifespan="on"

Routes:
- ``/healthz``  the process is alive (no auth, no upstream call);
- ``/readyz``   200 when the upstream's ``/health`` answers 200, else 503 (no auth);
- ``/v1/...``   every method, behind the API key, forwarded to the upstream by `proxy`;
- anything else: 404 in OpenAI error shape.

The ASGI lifespan opens the upstream session at startup and closes it at shutdown; there is
no state outside the app object. Each request does its header work in one pass; nothing the
gateway adds runs per chunk of a response.
"""

from __future__ import annotations

import logging
from urllib.parse import quote

from serving.gateway.asgi import ASGIApp, Receive, Scope, Send
from serving.gateway.auth import Authenticator, StaticKeyAuthenticator
from serving.gateway.errors import BodyTooLargeError, GatewayError, RouteNotFoundError
from serving.gateway.headers import REQUEST_ID, request_id
from serving.gateway.proxy import Proxy, ProxyRequest
from serving.gateway.responses import send_error, send_json
from serving.gateway.settings import GatewaySettings
from serving.gateway.upstream import UpstreamClient

logger = logging.getLogger(__name__)

API_PREFIX = "/v1/"


class ClientDisconnected(Exception):
    """The client went away before its request body was complete."""


def create_app(settings: GatewaySettings, *, authenticator: Authenticator | None = None) -> ASGIApp:
    """A new gateway app; `authenticator` defaults to the settings' development keys."""
    return GatewayApp(settings, authenticator=authenticator)


class GatewayApp:
    def __init__(
        self, settings: GatewaySettings, *, authenticator: Authenticator | None = None
    ) -> None:
        self.settings = settings
        self.upstream = UpstreamClient(settings)
        self.authenticator = authenticator or StaticKeyAuthenticator(settings.api_key_digests)
        self.proxy = Proxy(self.upstream, retry_after_s=settings.retry_after_s)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)
        else:
            raise RuntimeError(f"unsupported ASGI scope type {kind!r}")

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.upstream.start()
                except Exception as exc:
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.upstream.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        authorization: bytes | None = None
        client_request_id: bytes | None = None
        content_length: bytes | None = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value
            elif name == REQUEST_ID:
                client_request_id = value
            elif name == b"content-length":
                content_length = value
        rid = request_id(client_request_id)
        path: str = scope["path"]
        try:
            if path.startswith(API_PREFIX) and _is_plain_path(path):
                principal = self.authenticator.authenticate(authorization)
                body = await read_body(receive, self.settings.max_body_bytes, content_length)
                target = scope.get("raw_path") or quote(path).encode()
                if scope["query_string"]:
                    target += b"?" + scope["query_string"]
                request = ProxyRequest(scope["method"], target, scope["headers"], body, rid)
                outcome = await self.proxy.forward(request, receive, send)
                logger.debug(
                    "request %s key=%s status=%d", rid.decode(), principal.key_id, outcome.status
                )
            elif path == "/healthz":
                await send_json(send, 200, {"status": "ok"}, request_id=rid)
            elif path == "/readyz":
                await self._readyz(send, rid)
            else:
                raise RouteNotFoundError(f"Invalid URL ({scope['method']} {path})")
        except GatewayError as error:
            await send_error(send, error, request_id=rid)
        except ClientDisconnected:
            logger.info("request %s: client disconnected while sending its body", rid.decode())

    async def _readyz(self, send: Send, rid: bytes) -> None:
        reason = await self.upstream.probe_health()
        if reason is None:
            await send_json(send, 200, {"status": "ready"}, request_id=rid)
            return
        retry = [(b"retry-after", str(self.settings.retry_after_s).encode())]
        await send_json(
            send, 503, {"status": "unavailable", "reason": reason}, request_id=rid, headers=retry
        )


def _is_plain_path(path: str) -> bool:
    """False for paths with `.` or `..` segments, which some servers would normalise."""
    return "/." not in path or all(part not in (".", "..") for part in path.split("/"))


async def read_body(receive: Receive, limit: int, content_length: bytes | None) -> bytes:
    """The whole request body, or `BodyTooLargeError` as soon as it exceeds `limit`."""
    too_large = BodyTooLargeError(f"Request body is larger than {limit} bytes.")
    if content_length is not None and content_length.isdigit() and int(content_length) > limit:
        raise too_large
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnected()
        chunk: bytes = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit:
                raise too_large
            chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
