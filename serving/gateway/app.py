"""The gateway as one plain ASGI application.

    app = create_app(settings)     # run it with uvicorn, lifespan="on" (see `server`)

Routes:
- ``/healthz``  the process is alive (no auth, no upstream call);
- ``/readyz``   200 when an engine is in the rotation (the health monitor's last probe of
                its ``/health`` passed), the shared quota store (Redis, when set) answers or
                its failure policy is `local`, the keys kept in Redis (when set) have been
                loaded once, some key store loads (a broken keys file alone is not enough),
                and the gateway is not draining, else 503 (no auth; it never
                calls an engine or Redis itself);
- ``/playground`` the chat page (`playground`; no auth: its API calls send the user's key);
- ``/admin/``   the operator's API behind its own keys (`admin`): usage reports, runtime
                adapters; 404 without an admin key configured;
- ``/metrics``  Prometheus text format, the aggregate series only (no auth: no series here
                names a key or a model); every series, per key too, is on the
                --metrics-port (`metrics_listener`) alone;
- every other path: the route table (`route_table`), the same for every key: the metered
                routes (chat completions, completions, Responses: `completions`), the free
                ones (the model list; tokenize when opted in) behind an API key, vLLM's
                ``/health`` answered from the health monitor without one, and a 403 or 404
                in OpenAI error shape for everything else, before anything reaches vLLM.

Everything lives on the app object (no globals): key stores, quota engine, the router over
the engines (`routing`), metrics registry.
Quota counters live in this process (`InMemoryQuotaStore`, budgets journaled to keys.db) or,
with `redis_url`, in Redis shared by the replicas (`RedisQuotaStore` behind the
`redis_failure_policy`); with it, API keys kept in Redis are read too (`keys.redis_refresh`).
The ASGI lifespan loads those keys, opens each engine's client, checks Redis and starts the
background jobs at startup (the engines' health checks; lease upkeep, which also probes Redis
and delivers lease endings that waited for it; the key refresh), and stops them, drains the
budget journal and closes the stores at shutdown.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from serving.gateway.adapters.install import install_adapters
from serving.gateway.admin.api import AdminApi, is_admin_path
from serving.gateway.auth import (
    Authenticator,
    Caller,
    KeyStoreAuthenticator,
    StaticKeyAuthenticator,
)
from serving.gateway.catalog import ModelCatalog
from serving.gateway.completions import Completions
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
from serving.gateway.fair_queue import FairQueue
from serving.gateway.forwarded_headers import REQUEST_ID, request_id
from serving.gateway.health import HealthMonitor
from serving.gateway.images import ImagePolicy
from serving.gateway.keys import FileKeyStore, KeyStore, SqliteKeyStore
from serving.gateway.keys.redis_refresh import RedisKeyRefresh
from serving.gateway.lifespan import run_lifespan
from serving.gateway.metrics import CONTENT_TYPE, NONE, GatewayMetrics, RequestRecord
from serving.gateway.metrics_listener import MetricsListener
from serving.gateway.openai_request import check_tokenize_body
from serving.gateway.periodic import Periodic
from serving.gateway.playground import Playground
from serving.gateway.proxy import Proxy, ProxyOutcome, ProxyRequest
from serving.gateway.quota import (
    Clock,
    InMemoryQuotaStore,
    QuotaEngine,
    QuotaStore,
    QuotaStoreUnavailable,
    SqliteBudgetJournal,
    rate_limit_raw_headers,
)
from serving.gateway.quota.failure_policy import FailurePolicy, GuardedQuotaStore
from serving.gateway.quota.redis_store import RedisQuotaStore
from serving.gateway.request_body import is_plain_path, read_body, worth_precheck
from serving.gateway.responses import send_bytes, send_error, send_json
from serving.gateway.route_table import (
    HEALTH_PATH,
    ROUTES,
    TOKENIZE_PATH,
    Route,
    RouteTable,
)
from serving.gateway.routing.fleet import Fleet
from serving.gateway.settings import GatewaySettings
from serving.gateway.types import RawHeaders, Receive, Scope, Send
from serving.gateway.usage_reports import install_usage_reports

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
    return GatewayApp(settings, authenticator=authenticator, clock=clock, routes=routes)


class GatewayApp:
    # Set by `_build_authenticator` when keys live in Redis too; run by the lifespan.
    key_refresh: RedisKeyRefresh | None = None

    def __init__(
        self,
        settings: GatewaySettings,
        *,
        authenticator: Authenticator | None = None,
        clock: Clock | None = None,
        routes: RouteTable = ROUTES,
    ) -> None:
        self.settings = settings
        self.routes = routes
        self.draining = False
        self._opt_in = frozenset(settings.serve_routes)
        self.closers: list[Callable[[], None]] = []
        self.async_closers: list[Callable[[], Awaitable[None]]] = []
        self.fleet = Fleet(settings, changed=self._engines_changed)
        self.router = self.fleet.router
        self.keys_file: FileKeyStore | None = None
        self.authenticator = authenticator or self._build_authenticator()
        journal = None
        self.shared_quota: GuardedQuotaStore | None = None
        store: QuotaStore
        if settings.redis_url:
            # Day and month budgets live in Redis too: no journal.
            shared = RedisQuotaStore.from_url(
                settings.redis_url, timeout_s=settings.redis_timeout_s, clock=clock
            )
            self.async_closers.append(shared.close)
            store = self.shared_quota = GuardedQuotaStore(
                shared,
                policy=FailurePolicy(settings.redis_failure_policy),
                replicas=settings.redis_replicas,
                clock=clock,
            )
        else:
            if settings.keys_db:
                journal = SqliteBudgetJournal(Path(settings.keys_db))
                self.closers.append(journal.close)
            store = InMemoryQuotaStore(clock, journal=journal)
        self.quota = QuotaEngine(
            store, default_max_tokens=settings.default_max_tokens, lease_ttl=settings.lease_ttl_s
        )
        shared_quota, discovery = self.shared_quota, self.fleet.discovery
        slots = settings.queue_slots
        self.queue = (
            FairQueue(slots, reserved=settings.reserved_slots, timeout_s=settings.queue_timeout_s)
            if slots is not None
            else None
        )
        if self.queue is not None:
            self.fleet.size_queue(self.queue.resize)  # slots of the engines in rotation only
        self.metrics = GatewayMetrics(
            leases=store.active_leases,
            budget_flush_failures=journal.failures if journal is not None else lambda: 0,
            # read at each scrape: the ledger and the adapters are set up further down
            usage_write_failures=lambda: self.usage.failures(),
            adapter_sync_errors=lambda: self.adapters.errors,
            quota_store_up=(lambda: shared_quota.up) if shared_quota else lambda: True,
            quota_store_errors=(lambda: shared_quota.errors) if shared_quota else lambda: 0,
            keys_file_up=self._refresh_keys_file,
            engines=self.fleet.everything,
            discovery_errors=(lambda: discovery.errors) if discovery else lambda: 0,
            queue=self.queue,
        )
        self.metrics_listener = (
            MetricsListener(self.metrics.render, host=settings.host, port=settings.metrics_port)
            if settings.metrics_port is not None
            else None
        )
        self.catalog = ModelCatalog()
        self.admin = AdminApi(settings.admin_key_digests, max_body_bytes=settings.max_body_bytes)
        self.usage = install_usage_reports(self)  # the ledger, and GET /admin/v1/usage
        self.playground = Playground.load()
        self.proxy = Proxy(self.router, retry_after_s=settings.retry_after_s)
        self.completions = Completions(
            self.quota,
            self.proxy,
            self.catalog,
            ImagePolicy.from_settings(settings),
            queue=self.queue,
            retry_after_s=settings.retry_after_s,
            engine_priority=settings.engine_priority,
            stream_interval=settings.stream_interval,
        )
        self.health = HealthMonitor(
            self.router, self.catalog, self.metrics, interval_s=settings.health_interval_s
        )
        self.adapters = install_adapters(self)  # the admin adapter routes, and their sync
        # Running requests renew their leases well before the TTL; leaked ones are reclaimed.
        upkeep_every = min(settings.health_interval_s, settings.lease_ttl_s / 3)
        self.lease_upkeep = Periodic("lease upkeep", self._upkeep_leases, interval_s=upkeep_every)

    def _build_authenticator(self) -> Authenticator:
        settings = self.settings
        stores: list[KeyStore] = []
        if settings.keys_db:
            stores.append(SqliteKeyStore(Path(settings.keys_db)))
        if settings.keys_file:
            self.keys_file = FileKeyStore(Path(settings.keys_file))
            stores.append(self.keys_file)
        if settings.redis_url:
            # The replicas' shared keys (`serving keys --redis-url`): a snapshot in memory,
            # loaded at startup and refreshed every second by the lifespan.
            self.key_refresh = RedisKeyRefresh.from_url(settings.redis_url)
            stores.append(self.key_refresh.store)
        dev = StaticKeyAuthenticator(settings.api_key_digests) if settings.api_key_digests else None
        authenticator = KeyStoreAuthenticator(stores, dev=dev)
        self.closers.append(authenticator.close)
        return authenticator

    def _refresh_keys_file(self) -> bool:
        """Re-read the keys file if it changed; whether it parses (True when there is none).
        Scrapes and /readyz call it, so a broken edit shows even with no traffic."""
        keys_file = self.keys_file
        if keys_file is None:
            return True
        keys_file.reload_if_changed()
        return keys_file.broken is None

    async def _upkeep_leases(self) -> None:
        if self.shared_quota is not None:
            await self.shared_quota.check()
        await self.completions.renew_running()
        await self.quota.reclaim_expired()

    async def _engines_changed(self) -> None:
        """Discovery added or drained engines: the new ones are probed now rather than at the
        next health check (the queue's slots follow the rotation: `Fleet.size_queue`)."""
        self.catalog.retain(engine.index for engine in self.router.engines)
        await self.health.check()

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
        await run_lifespan(self, receive, send)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
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
            try:
                await self._api(scope, receive, send, rid, authorization, content_length, record)
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
    ) -> None:
        """Every path but the gateway's own: the route table decides (refusals before the
        key is even checked), and this is the one place where an exception becomes the
        client's answer."""
        path: str = scope["path"]
        method: str = scope["method"]
        caller: Caller | None = None
        try:
            if not is_plain_path(path):
                raise RouteNotFoundError(f"Invalid URL ({method} {path})")
            route = self.routes.lookup(method, path, opt_in=self._opt_in)
            caller = self.authenticator.authenticate(authorization)
            record.key = caller.key_id
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
            request = ProxyRequest(method, target, scope["headers"], body, rid)
            kind = route.metered
            if kind is not None:
                await self.completions.handle(kind, caller, request, receive, send, record)
            elif route.metering == "models":
                await self._models(caller, send, rid, record)
            else:
                await self._forward_free(route, caller, request, receive, send, record)
        except QuotaStoreUnavailable:  # the policy is to fail closed
            error = quota_unavailable_error(self.settings.retry_after_s)
            await self._answer(error, send, rid, record)
        except GatewayError as error:
            await self._answer(error, send, rid, record, caller)
        except ClientGone:  # or was cut off by the body deadline (a 408); metrics count a 499
            logger.info("request %s: client went away before it was answered", rid.decode())
        except Exception:
            # A bug, never the client's fault: logged with its traceback, answered in OpenAI's
            # shape like any other failure.
            logger.exception("request %s failed", rid.decode())
            internal = InternalError("The server had an error while processing your request.")
            with contextlib.suppress(Exception):  # the client may be gone too
                await self._answer(internal, send, rid, record)

    async def _answer(
        self,
        error: GatewayError,
        send: Send,
        rid: bytes,
        record: RequestRecord,
        caller: Caller | None = None,
    ) -> None:
        """The one place a failure becomes the client's answer: an OpenAI error JSON (with the
        key's rate-limit state, when it is known and the error is not a 429 carrying its
        own), or, once a response has started, a final SSE error event (any other started
        response is cut: the client sees it truncated)."""
        exchange = record.exchange
        if exchange is not None and exchange.status:
            if exchange.sse:  # ends a half-sent event first, so the error parses on its own
                body = (b"\n\n" if exchange.open_event else b"") + error.sse_event()
                await send({"type": "http.response.body", "body": body, "more_body": False})
            return
        record.status = error.http_status
        headers: RawHeaders = []
        if caller is not None and not isinstance(error, RateLimitError):
            with contextlib.suppress(QuotaStoreUnavailable):  # the error matters more
                headers = rate_limit_raw_headers(await self.quota.status(caller, ""))
        await send_error(send, error, request_id=rid, headers=headers)

    async def _forward_free(
        self,
        route: Route,
        caller: Caller,
        request: ProxyRequest,
        receive: Receive,
        send: Send,
        record: RequestRecord,
    ) -> None:
        """An unmetered route (the model list; tokenize when served): passed through with the
        key's rate-limit headers. A tokenize body is checked as a chat or completion body is
        (fields, media), since vLLM renders it the same way."""
        if route.path == TOKENIZE_PATH:
            check_tokenize_body(request.body, self.completions.images)
        headers = rate_limit_raw_headers(await self.quota.status(caller, ""))
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
        shared = self.shared_quota
        reason = "draining" if self.draining else self.health.unready_reason
        self._refresh_keys_file()
        if reason is None and isinstance(self.authenticator, KeyStoreAuthenticator):
            reason = self.authenticator.unready_reason
        if reason is None and self.key_refresh is not None and not self.key_refresh.loaded:
            reason = "API keys not loaded from Redis yet"
        if reason is None and shared is not None:
            reason = shared.unready_reason
        if reason is None:
            body: dict[str, str] = {"status": "ready"}
            if shared is not None and shared.degraded:
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
