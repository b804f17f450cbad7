"""The gateway's parts, built and wired in one place.

    gateway = assemble(settings)        # create_app's work: every part, each given what it uses
    gateway.lifespan                    # starts and stops the engines' clients, jobs and stores
    GatewayApp(gateway, routes=ROUTES)  # serves HTTP with the parts (`app`)

Every part gets what it needs as constructor arguments and is built after them, so nothing is
read before it exists and no part holds, or imports, the app. The one loop is the engines'
own: discovery's `changed` callback (engines joined or left) probes them with the health
monitor, which needs the fleet's router; the callback is the closure `engines_changed`, which
discovery calls only once the lifespan has started.

Shutdown closes what was opened here, in the order it was opened (`Lifespan`): the Redis
quota store, then the usage ledger; the key stores, the budget journal, then the adapter
registry (off the event loop).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from serving.gateway.adapters.install import install_adapters
from serving.gateway.admin.api import AdminApi
from serving.gateway.auth import (
    Authenticator,
    Caller,
    KeyStoreAuthenticator,
    StaticKeyAuthenticator,
    dev_key_id,
)
from serving.gateway.batches.install import Batches, install_batches
from serving.gateway.batches.owners import caller_in_stores
from serving.gateway.catalog import ModelCatalog
from serving.gateway.completions import Completions
from serving.gateway.fair_queue import FairQueue
from serving.gateway.health import HealthMonitor
from serving.gateway.images import ImagePolicy
from serving.gateway.keys import FileKeyStore, KeyStore, SqliteKeyStore
from serving.gateway.keys.redis_refresh import RedisKeyRefresh
from serving.gateway.lifespan import Lifespan
from serving.gateway.metrics import GatewayMetrics, RequestRecord
from serving.gateway.metrics_listener import MetricsListener
from serving.gateway.periodic import Periodic
from serving.gateway.playground import Playground
from serving.gateway.proxy import Proxy
from serving.gateway.quota import (
    Clock,
    InMemoryQuotaStore,
    QuotaEngine,
    QuotaStore,
    SqliteBudgetJournal,
)
from serving.gateway.quota.failure_policy import FailurePolicy, GuardedQuotaStore
from serving.gateway.quota.redis_client import RedisClient
from serving.gateway.quota.redis_store import RedisQuotaStore
from serving.gateway.routing.fleet import Fleet
from serving.gateway.routing.router import Router
from serving.gateway.settings import GatewaySettings
from serving.gateway.shared_slots import SharedSlots
from serving.gateway.usage_ledger.recorder import UsageRecorder
from serving.gateway.usage_reports import NotRecorded, install_usage_reports

Closers = list[Callable[[], None]]
AsyncClosers = list[Callable[[], Awaitable[None]]]


@dataclass(frozen=True)
class KeyStores:
    """Who may call: the authenticator, and the stores behind it that need looking after."""

    authenticator: Authenticator
    keys_file: FileKeyStore | None = None
    # The keys kept in Redis: loaded at startup and refreshed by the lifespan.
    key_refresh: RedisKeyRefresh | None = None
    stores: tuple[KeyStore, ...] = ()
    dev_ids: tuple[str, ...] = ()
    """The development keys' public ids."""

    def caller_of(self, key_id: str) -> Caller | None:
        """The active key of public id `key_id` (a batch's owner, found again)."""
        return caller_in_stores(self.stores, self.dev_ids, key_id)

    def keys_file_up(self) -> bool:
        """Re-read the keys file if it changed; whether it parses (True when there is none).
        Scrapes and /readyz call it, so a broken edit shows even with no traffic."""
        if self.keys_file is None:
            return True
        self.keys_file.reload_if_changed()
        return self.keys_file.broken is None

    @property
    def unready_reason(self) -> str | None:
        """Why the keys cannot be checked yet: no store loads, or Redis's not loaded once."""
        authenticator = self.authenticator
        if isinstance(authenticator, KeyStoreAuthenticator) and authenticator.unready_reason:
            return authenticator.unready_reason
        if self.key_refresh is not None and not self.key_refresh.loaded:
            return "API keys not loaded from Redis yet"
        return None


def open_key_stores(settings: GatewaySettings, closers: Closers) -> KeyStores:
    """The settings' key stores (keys.db, the keys file, Redis) and development keys."""
    stores: list[KeyStore] = []
    keys_file = key_refresh = None
    if settings.keys_db:
        stores.append(SqliteKeyStore(Path(settings.keys_db)))
    if settings.keys_file:
        keys_file = FileKeyStore(Path(settings.keys_file))
        stores.append(keys_file)
    if settings.redis_url:
        # The replicas' shared keys (`serving keys --redis-url`): a snapshot in memory,
        # loaded at startup and refreshed every second by the lifespan.
        key_refresh = RedisKeyRefresh.from_url(settings.redis_url)
        stores.append(key_refresh.store)
    dev = StaticKeyAuthenticator(settings.api_key_digests) if settings.api_key_digests else None
    authenticator = KeyStoreAuthenticator(stores, dev=dev)
    closers.append(authenticator.close)
    dev_ids = tuple(dev_key_id(index) for index in range(len(settings.api_key_digests)))
    return KeyStores(authenticator, keys_file, key_refresh, tuple(stores), dev_ids)


@dataclass(frozen=True)
class Quota:
    engine: QuotaEngine
    # Redis behind its failure policy, when the counters are shared by the replicas.
    shared: GuardedQuotaStore | None
    # Settled day and month budgets in keys.db, when the counters are this process's.
    journal: SqliteBudgetJournal | None


def open_quota(
    settings: GatewaySettings, clock: Clock | None, closers: Closers, async_closers: AsyncClosers
) -> Quota:
    """The quota engine over Redis (`redis_url`) or this process's memory."""
    journal = shared = None
    store: QuotaStore
    if settings.redis_url:
        # Day and month budgets live in Redis too: no journal.
        redis = RedisQuotaStore.from_url(
            settings.redis_url, timeout_s=settings.redis_timeout_s, clock=clock
        )
        async_closers.append(redis.close)
        store = shared = GuardedQuotaStore(
            redis,
            policy=FailurePolicy(settings.redis_failure_policy),
            replicas=settings.redis_replicas,
            clock=clock,
        )
    else:
        if settings.keys_db:
            journal = SqliteBudgetJournal(Path(settings.keys_db))
            closers.append(journal.close)
        store = InMemoryQuotaStore(clock, journal=journal)
    engine = QuotaEngine(
        store, default_max_tokens=settings.default_max_tokens, lease_ttl=settings.lease_ttl_s
    )
    return Quota(engine, shared, journal)


@dataclass(frozen=True)
class Readiness:
    """/readyz's verdict from the parts it depends on (the app adds its own draining)."""

    health: HealthMonitor
    keys: KeyStores
    shared_quota: GuardedQuotaStore | None

    def unready_reason(self, *, draining: bool) -> str | None:
        reason = "draining" if draining else self.health.unready_reason
        self.keys.keys_file_up()
        if reason is None:
            reason = self.keys.unready_reason
        if reason is None and self.shared_quota is not None:
            reason = self.shared_quota.unready_reason
        return reason

    @property
    def quota_degraded(self) -> bool:
        return self.shared_quota is not None and self.shared_quota.degraded


@dataclass(frozen=True, kw_only=True)
class Gateway:
    """What the app serves requests with, and the lifespan that runs the rest."""

    settings: GatewaySettings
    authenticator: Authenticator
    quota: QuotaEngine
    queue: FairQueue | None
    router: Router
    metrics: GatewayMetrics
    admin: AdminApi
    usage: UsageRecorder | NotRecorded
    playground: Playground
    proxy: Proxy
    completions: Completions
    batches: Batches | None
    health: HealthMonitor
    readiness: Readiness
    lifespan: Lifespan


def assemble(
    settings: GatewaySettings,
    *,
    authenticator: Authenticator | None = None,
    clock: Clock | None = None,
) -> Gateway:
    """Every part of a gateway for `settings`. `authenticator` replaces the settings' key
    stores and development keys; `clock` (tests) drives the quota windows."""
    closers: Closers = []
    async_closers: AsyncClosers = []
    catalog = ModelCatalog()

    async def engines_changed() -> None:
        """Discovery added or drained engines: the new ones are probed now rather than at the
        next health check (the queue's slots follow the rotation: `Fleet.size_queue`)."""
        catalog.retain(engine.index for engine in fleet.router.engines)
        await health.check()  # built below; discovery runs once the lifespan has started

    fleet = Fleet(settings, changed=engines_changed)
    router = fleet.router
    keys = KeyStores(authenticator) if authenticator else open_key_stores(settings, closers)
    quota = open_quota(settings, clock, closers, async_closers)
    slots = settings.queue_slots
    queue = (
        FairQueue(slots, reserved=settings.reserved_slots, timeout_s=settings.queue_timeout_s)
        if slots is not None
        else None
    )
    if queue is not None:
        fleet.size_queue(queue.resize)  # slots of the engines in rotation only
    slot_sync, shared_slots = share_queue(settings, queue, async_closers)
    admin = AdminApi(settings.admin_key_digests, max_body_bytes=settings.max_body_bytes)
    usage = install_usage_reports(settings, admin, keys.authenticator)  # GET /admin/v1/usage
    async_closers.append(usage.close)
    adapters = install_adapters(settings, router, catalog, admin)  # the admin adapter routes
    async_closers.append(adapters.close)
    shared, journal, discovery = quota.shared, quota.journal, fleet.discovery
    metrics = GatewayMetrics(
        leases=quota.engine.store.active_leases,
        budget_flush_failures=journal.failures if journal is not None else lambda: 0,
        usage_write_failures=usage.failures,
        adapter_sync_errors=lambda: adapters.errors,
        quota_store_up=(lambda: shared.up) if shared else lambda: True,
        quota_store_errors=(lambda: shared.errors) if shared else lambda: 0,
        keys_file_up=keys.keys_file_up,
        engines=fleet.everything,
        retired=lambda: fleet.router.retired,
        discovery_errors=(lambda: discovery.errors) if discovery else lambda: 0,
        queue=queue,
        slots_shared=(lambda: shared_slots.up) if shared_slots else lambda: None,
    )
    metrics_listener = (
        MetricsListener(metrics.render, host=settings.host, port=settings.metrics_port)
        if settings.metrics_port is not None
        else None
    )
    proxy = Proxy(router, retry_after_s=settings.retry_after_s)
    completions = Completions(
        quota.engine,
        proxy,
        catalog,
        ImagePolicy.from_settings(settings),
        queue=queue,
        retry_after_s=settings.retry_after_s,
        engine_priority=settings.engine_priority,
        stream_interval=settings.stream_interval,
        max_pooling_inputs=settings.max_pooling_inputs,
    )
    health = HealthMonitor(router, catalog, metrics, interval_s=settings.health_interval_s)

    def observe(record: RequestRecord) -> None:
        """A batch line's record, counted as the app counts an interactive request's (its
        tokens marked as a batch line's in the usage ledger)."""
        metrics.observe(record, time.perf_counter())
        usage.record(record, batch=True)

    batches = install_batches(
        settings,
        completions,
        catalog,
        quota=quota.engine,
        find_owner=None if authenticator else keys.caller_of,  # a test's: callers as seen
        observe=observe,
        written=usage.flush if isinstance(usage, UsageRecorder) else None,
    )
    if batches is not None:
        async_closers.append(batches.close)
        metrics.add_source(batches.metrics.families)

    async def upkeep_leases() -> None:
        if shared is not None:
            await shared.check()
        await completions.renew_leases()
        await quota.engine.reclaim_expired()

    # Running requests renew their leases well before the TTL; leaked ones are reclaimed.
    upkeep_every = min(settings.health_interval_s, settings.lease_ttl_s / 3)
    lifespan = Lifespan(
        fleet=fleet,
        health=health,
        adapters=adapters,
        lease_upkeep=Periodic("lease upkeep", upkeep_leases, interval_s=upkeep_every),
        slot_sync=slot_sync,
        key_refresh=keys.key_refresh,
        shared_quota=shared,
        metrics_listener=metrics_listener,
        batch_runner=batches.runner if batches is not None else None,
        async_closers=async_closers,
        closers=closers,
    )
    return Gateway(
        settings=settings,
        authenticator=keys.authenticator,
        quota=quota.engine,
        queue=queue,
        router=router,
        metrics=metrics,
        admin=admin,
        usage=usage,
        playground=Playground.load(),
        proxy=proxy,
        completions=completions,
        batches=batches,
        health=health,
        readiness=Readiness(health, keys, shared),
        lifespan=lifespan,
    )


def share_queue(
    settings: GatewaySettings, queue: FairQueue | None, async_closers: AsyncClosers
) -> tuple[Periodic | None, SharedSlots | None]:
    """With a fair queue and Redis, the replicas share the engines' slots (`shared_slots`):
    the job that keeps this replica's part, run from the lifespan."""
    if queue is None or not settings.redis_url:
        return None, None
    client = RedisClient.from_url(settings.redis_url, timeout_s=settings.redis_timeout_s)
    interval = settings.slot_sync_interval_s
    shared = SharedSlots(client, queue, interval_s=interval, replicas=settings.redis_replicas)
    async_closers.append(shared.close)
    return Periodic("slot sharing", shared.sync, interval_s=interval), shared
