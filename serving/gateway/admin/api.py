"""The operator's API under /admin/: keys of its own (never a tenant key), routes of its own.

    admin = AdminApi(settings.admin_key_digests, max_body_bytes=settings.max_body_bytes)
    admin.add("GET", "/admin/v1/usage", usage_handler)            # an exact path
    admin.add("DELETE", "/admin/v1/adapters/", unload, prefix=True)  # request.tail: the rest
    if is_admin_path(path):
        await admin.serve(scope, receive, send, request_id=rid, authorization=header)

A handler takes an `AdminRequest` and returns `(status, json-able payload)`; it raises a
`GatewayError` (400 naming the field, 404, ...) for anything the caller got wrong, answered in
OpenAI's error shape like every other refusal. Without an admin key configured every path
under /admin/ answers 404, so a gateway that does not use the admin API does not show it.
Tenant keys are never admin keys: the two are checked by different authenticators, so a
tenant key gets the same 401 here as a wrong key.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from urllib.parse import parse_qsl

from serving.gateway.auth import StaticKeyAuthenticator
from serving.gateway.errors import (
    BodyTooLargeError,
    EndpointNotAllowedError,
    GatewayError,
    InternalError,
    InvalidRequestError,
    RouteNotFoundError,
)
from serving.gateway.responses import send_error, send_json
from serving.gateway.types import Receive, Scope, Send

logger = logging.getLogger(__name__)

ADMIN_PREFIX = "/admin/"


@dataclass(frozen=True, slots=True)
class AdminRequest:
    method: str
    path: str
    tail: str
    """With a prefix route: the rest of the path after the prefix (e.g. an adapter's name)."""
    query: dict[str, str]
    body: bytes


Handler = Callable[[AdminRequest], Awaitable[tuple[int, object]]]


def is_admin_path(path: str) -> bool:
    return path.startswith(ADMIN_PREFIX) or path == ADMIN_PREFIX.rstrip("/")


class AdminApi:
    def __init__(self, digests: Sequence[str], *, max_body_bytes: int) -> None:
        self._auth = StaticKeyAuthenticator(digests) if digests else None
        self._max_body_bytes = max_body_bytes
        self._exact: dict[tuple[str, str], Handler] = {}
        self._prefixes: list[tuple[str, str, Handler]] = []

    @property
    def enabled(self) -> bool:
        return self._auth is not None

    def add(self, method: str, path: str, handler: Handler, *, prefix: bool = False) -> None:
        if not path.startswith(ADMIN_PREFIX):
            raise ValueError(f"admin routes live under {ADMIN_PREFIX}, not {path}")
        if prefix:
            self._prefixes.append((method, path, handler))
        else:
            self._exact[(method, path)] = handler

    async def serve(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        *,
        request_id: bytes,
        authorization: bytes | None,
    ) -> int:
        """Answer one admin request; the status sent."""
        try:
            status, payload = await self._answer(scope, receive, authorization)
        except GatewayError as error:
            await send_error(send, error, request_id=request_id)
            return error.http_status
        except Exception:
            logger.exception("admin request %s failed", request_id.decode())
            internal = InternalError("The server had an error while processing your request.")
            await send_error(send, internal, request_id=request_id)
            return internal.http_status
        await send_json(send, status, payload, request_id=request_id)
        return status

    async def _answer(
        self, scope: Scope, receive: Receive, authorization: bytes | None
    ) -> tuple[int, object]:
        method: str = scope["method"]
        path: str = scope["path"]
        if self._auth is None:
            raise RouteNotFoundError(f"Invalid URL ({method} {path})")
        self._auth.authenticate(authorization)  # before the path says anything
        handler, tail = self._find(method, path)
        raw_query: bytes = scope.get("query_string", b"")
        try:
            pairs = parse_qsl(raw_query.decode("ascii"), strict_parsing=bool(raw_query))
        except (UnicodeDecodeError, ValueError):
            raise InvalidRequestError("The query string is not valid.") from None
        query: dict[str, str] = {}
        for name, value in pairs:
            if name in query:
                raise InvalidRequestError(f"Query parameter {name!r} is given twice.", param=name)
            query[name] = value
        body = await self._read_body(receive)
        return await handler(AdminRequest(method, path, tail, query, body))

    def _find(self, method: str, path: str) -> tuple[Handler, str]:
        handler = self._exact.get((method, path))
        if handler is not None:
            return handler, ""
        methods = {m for (m, p) in self._exact if p == path}
        for route_method, prefix, prefix_handler in self._prefixes:
            if path.startswith(prefix) and len(path) > len(prefix):
                if route_method == method:
                    return prefix_handler, path[len(prefix) :]
                methods.add(route_method)
        if methods:
            allowed = ", ".join(sorted(methods))
            raise EndpointNotAllowedError(f"{method} {path}: it answers {allowed} only.")
        raise RouteNotFoundError(f"Invalid URL ({method} {path})")

    async def _read_body(self, receive: Receive) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return b""
            chunk: bytes = message.get("body", b"")
            size += len(chunk)
            if size > self._max_body_bytes:
                raise BodyTooLargeError(
                    f"Request body is larger than {self._max_body_bytes} bytes."
                )
            if chunk:
                chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)
