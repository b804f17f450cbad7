"""The gateway as one plain ASGI application (docs/architecture.md, the request path; the
routes: docs/gateway.md, routes).

    app = create_app(settings)     # run it with uvicorn, lifespan="on" (see `server`)

Rules:
- `/healthz`, `/readyz`, `/playground`, `/metrics` (aggregate series only) and vLLM's
  `/health` (from the health monitor) need no key; `/readyz` never calls an engine or Redis
  itself; `/admin/` answers 404 without an admin key configured;
- every other path goes through the route table (`route_table`), the same for every key,
  and is refused (403 or 404) before anything reaches vLLM unless it is served;
- no globals: `assembly.assemble` builds the parts, each handed what it uses; the parts
  never see the app; `_api` is the one error boundary.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time

from serving.gateway.admin.api import is_admin_path
from serving.gateway.anthropic_errors import ANTHROPIC
from serving.gateway.api_dialect import Dialect
from serving.gateway.assembly import Gateway, assemble
from serving.gateway.auth import Authenticator, Caller, bearer_of_api_key
from serving.gateway.errors import (
    ClientGone,
    GatewayError,
    InternalError,
    RateLimitError,
    RouteNotFoundError,
    UpstreamUnavailableError,
    quota_unavailable_error,
    refusal_error,
    retry_after_headers,
    upstream_error_kind,
)
from serving.gateway.forwarded_headers import REQUEST_ID, request_id
from serving.gateway.metrics import CONTENT_TYPE, NONE, RequestRecord
from serving.gateway.openai_request import check_count_tokens_body, check_tokenize_body
from serving.gateway.proxy import ProxyOutcome, ProxyRequest
from serving.gateway.quota import Clock, QuotaStoreUnavailable, rate_limit_raw_headers
from serving.gateway.request_body import is_plain_path, read_body, worth_precheck
from serving.gateway.responses import send_bytes, send_error, send_json
from serving.gateway.route_table import (
    COUNT_TOKENS_PATH,
    HEALTH_PATH,
    ROUTES,
    TOKENIZE_PATH,
    Route,
    RouteTable,
    dialect_of,
)
from serving.gateway.settings import GatewaySettings
from serving.gateway.types import RawHeaders, Receive, Scope, Send

logger = logging.getLogger(__name__)

API_PREFIX = "/v1/"


def create_app(
    settings: GatewaySettings,
    *,
    authenticator: Authenticator | None = None,
    clock: Clock | None = None,
    routes: RouteTable = ROUTES,
) -> GatewayApp:
    """A new gateway app. `authenticator` defaults to the settings' key stores and
    development keys; `clock` (tests) drives the quota windows; `routes` (tests) adds paths
    to the route table."""
    return GatewayApp(assemble(settings, authenticator=authenticator, clock=clock), routes=routes)


class GatewayApp:
    """Serves HTTP with the parts `assembly.assemble` built; its lifespan runs the rest."""

    def __init__(self, gateway: Gateway, *, routes: RouteTable = ROUTES) -> None:
        self.settings = settings = gateway.settings
        self.routes = routes
        self.draining = False
        self._opt_in = frozenset(settings.serve_routes)
        self.authenticator = gateway.authenticator
        self.quota = gateway.quota
        self.queue = gateway.queue
        self.router = gateway.router
        self.metrics = gateway.metrics
        self.admin = gateway.admin
        self.usage = gateway.usage
        self.playground = gateway.playground
        self.proxy = gateway.proxy
        self.completions = gateway.completions
        self.batches = gateway.batches
        self.health = gateway.health
        self.readiness = gateway.readiness
        self.lifespan = gateway.lifespan

    def begin_drain(self) -> None:
        """Fail readiness from now on (SIGTERM); requests are still served."""
        if not self.draining:
            logger.info("draining: /readyz answers 503 from now on")
        self.draining = True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)
        else:
            raise RuntimeError(f"unsupported ASGI scope type {kind!r}")

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        await self.lifespan.run(receive, send)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        authorization: bytes | None = None
        api_key: bytes | None = None
        client_request_id: bytes | None = None
        content_length: bytes | None = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value
            elif name == b"x-api-key":
                api_key = value
            elif name == REQUEST_ID:
                client_request_id = value
            elif name == b"content-length":
                content_length = value
        rid = request_id(client_request_id)
        path: str = scope["path"]
        if path == "/metrics":  # whatever the settings: per-key spend is the metrics port's
            body = self.metrics.render_aggregate()
            await send_bytes(send, 200, body, request_id=rid, content_type=CONTENT_TYPE)
        elif path == "/healthz":
            await send_json(send, 200, {"status": "ok"}, request_id=rid)
        elif path == "/readyz":
            await self._readyz(send, rid)
        elif self.playground.handles(path):
            await self.playground.serve(scope, send, request_id=rid)
        elif path in (HEALTH_PATH, HEALTH_PATH + "/"):
            await self._health(scope, send, rid)
        elif is_admin_path(path):
            await self.admin.serve(
                scope, receive, send, request_id=rid, authorization=authorization
            )
        else:
            record = RequestRecord(started)
            self.metrics.in_flight += 1
            dialect = dialect_of(path)
            if authorization is None and dialect is ANTHROPIC:
                authorization = bearer_of_api_key(api_key)  # Anthropic's clients send it so
            try:
                await self._api(
                    scope, receive, send, rid, authorization, content_length, record, dialect
                )
            finally:
                self.metrics.in_flight -= 1
                if path.startswith(API_PREFIX) or record.key != NONE:
                    self.metrics.observe(record, time.perf_counter())
                    self.usage.record(record)  # the same numbers as gateway_tokens_total

    async def _api(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        rid: bytes,
        authorization: bytes | None,
        content_length: bytes | None,
        record: RequestRecord,
        dialect: Dialect,
    ) -> None:
        """Every path but the gateway's own: the route table decides (refusals before the
        key is even checked), and this is the one place where an exception becomes the
        client's answer, in the words of the path's API (`dialect`)."""
        path: str = scope["path"]
        method: str = scope["method"]
        caller: Caller | None = None
        try:
            if not is_plain_path(path):
                raise RouteNotFoundError(f"Invalid URL ({method} {path})")
            route = self.routes.lookup(method, path, opt_in=self._opt_in)
            caller = self.authenticator.authenticate(authorization)
            record.key = caller.key_id
            if route.metering == "batches":  # its uploads are streamed, not read here
                if self.batches is None:
                    raise RouteNotFoundError(f"Invalid URL ({method} {path})")
                record.status = 200  # its errors are recorded by `_answer`
                await self.batches.api.serve(
                    caller, method, path, scope["query_string"], scope["headers"], receive,
                    send, rid,
                )  # fmt: skip
                return
            if route.metered is not None and worth_precheck(content_length):
                # a key at its concurrency or requests/min limit costs no large body's read
                refusal = await self.quota.precheck(caller)
                if refusal is not None:
                    record.refusal = refusal.reason.value
                    raise refusal_error(refusal)
            body = await read_body(receive, self.settings.max_body_bytes, content_length)
            # vLLM's own spelling: it answers a variant with a redirect to itself
            target = route.path.encode()
            if scope["query_string"]:
                target += b"?" + scope["query_string"]
            request = ProxyRequest(method, target, scope["headers"], body, rid, dialect=dialect)
            kind = route.metered
            if kind is not None:
                await self.completions.handle(kind, caller, request, receive, send, record)
            elif route.metering == "models":
                await self._models(caller, send, rid, record)
            else:
                await self._forward_free(route, caller, request, receive, send, record)
        except QuotaStoreUnavailable:  # the policy is to fail closed
            error = quota_unavailable_error(self.settings.retry_after_s)
            await self._answer(error, send, rid, record, dialect=dialect)
        except GatewayError as error:
            await self._answer(error, send, rid, record, caller, dialect=dialect)
        except ClientGone:  # or was cut off by the body deadline (a 408); metrics count a 499
            logger.info("request %s: client went away before it was answered", rid.decode())
        except Exception:
            # A bug, never the client's fault: logged with its traceback, answered in OpenAI's
            # shape like any other failure.
            logger.exception("request %s failed", rid.decode())
            internal = InternalError("The server had an error while processing your request.")
            with contextlib.suppress(Exception):  # the client may be gone too
                await self._answer(internal, send, rid, record, dialect=dialect)

    async def _answer(
        self,
        error: GatewayError,
        send: Send,
        rid: bytes,
        record: RequestRecord,
        caller: Caller | None = None,
        *,
        dialect: Dialect,
    ) -> None:
        """The one place a failure becomes the client's answer: an error JSON in the words of
        the route's API (with the key's rate-limit state, when it is known and the error is
        not a 429 carrying its own), or, once a response has started, a final SSE error
        event (any other started response is cut: the client sees it truncated)."""
        exchange = record.exchange
        if exchange is not None and exchange.status:
            if exchange.sse:  # ends a half-sent event first, so the error parses on its own
                body = (b"\n\n" if exchange.open_event else b"") + dialect.sse_event(error)
                await send({"type": "http.response.body", "body": body, "more_body": False})
            return
        record.status = dialect.status(error)
        headers: RawHeaders = []
        if caller is not None and not isinstance(error, RateLimitError):
            with contextlib.suppress(QuotaStoreUnavailable):  # the error matters more
                headers = dialect.rate_limit_headers(await self.quota.status(caller, ""))
        await send_error(send, error, request_id=rid, headers=headers, dialect=dialect)

    async def _forward_free(
        self,
        route: Route,
        caller: Caller,
        request: ProxyRequest,
        receive: Receive,
        send: Send,
        record: RequestRecord,
    ) -> None:
        """An unmetered route (Messages' count_tokens; tokenize when served): passed through
        with the key's rate-limit headers. A tokenize body is checked as a chat or completion
        body is (fields, media), a count_tokens body as a Messages body, since vLLM renders
        them the same way."""
        if route.path == TOKENIZE_PATH:
            check_tokenize_body(request.body, self.completions.images)
        elif route.path == COUNT_TOKENS_PATH:
            check_count_tokens_body(request.body, self.completions.images)
        headers = request.dialect.rate_limit_headers(await self.quota.status(caller, ""))
        request = dataclasses.replace(request, response_headers=headers)
        outcome = record.exchange = ProxyOutcome()
        try:
            await self.proxy.forward(request, receive, send, outcome)
        finally:
            record.note_exchange(outcome)
            record.upstream_error = upstream_error_kind(
                outcome.error, outcome.upstream_status, None
            )

    async def _models(self, caller: Caller, send: Send, rid: bytes, record: RequestRecord) -> None:
        """`/v1/models` from the engines' own lists (`catalog`), only the models the key may
        use; 503 while no engine is in the rotation, as the engine's own would be."""
        if self.router.unready_reason is not None:
            raise UpstreamUnavailableError(
                "No model server is available; retry later.",
                retry_after_s=self.settings.retry_after_s,
            )
        headers = rate_limit_raw_headers(await self.quota.status(caller, ""))
        record.status = 200
        listing = self.completions.models_listing(caller)
        await send_json(send, 200, listing, request_id=rid, headers=headers)

    async def _health(self, scope: Scope, send: Send, rid: bytes) -> None:
        """vLLM's `/health` as its probes expect it (200 with an empty body, 503 when no
        engine is healthy), answered from the health monitor's last probe like /readyz."""
        try:
            self.routes.lookup(scope["method"], scope["path"])  # its methods: GET and HEAD
        except GatewayError as error:
            await send_error(send, error, request_id=rid)
            return
        status = 200 if self.health.unready_reason is None else 503
        await send_bytes(send, status, b"", request_id=rid, content_type=b"application/json")

    async def _readyz(self, send: Send, rid: bytes) -> None:
        reason = self.readiness.unready_reason(draining=self.draining)
        if reason is None:
            body: dict[str, str] = {"status": "ready"}
            if self.readiness.quota_degraded:
                body["quota_store"] = "unavailable: local limits apply"
            await send_json(send, 200, body, request_id=rid)
            return
        await send_json(
            send,
            503,
            {"status": "unavailable", "reason": reason},
            request_id=rid,
            headers=retry_after_headers(self.settings.retry_after_s),
        )
