"""Usage reports in a running gateway: its ledger, and GET /admin/v1/usage
(docs/usage-reports.md).

    usage = install_usage_reports(settings, admin, authenticator)   # by `assembly.assemble`
    usage.record(record)            # every API request, beside metrics.observe
    usage.record(record, batch=True)    # a Batch API line (`assembly`'s observe)
    await usage.close()             # at shutdown (the lifespan's last steps)

Rules:
- the ledger is Redis with `redis_url`, else keys.db's `usage_days`; with neither, nothing
  is recorded and the endpoint answers 404 `usage_not_recorded`;
- recording from the same record where `gateway_tokens_total` is observed keeps the report
  and that counter in agreement;
- the endpoint answers `usage_ledger.report.build_report`'s JSON, behind the admin keys,
  after writing what this gateway has not written yet (other replicas' last
  `FLUSH_INTERVAL_S` may be missing).
"""

from __future__ import annotations

import logging
from pathlib import Path

from serving.gateway.admin.api import AdminApi, AdminRequest
from serving.gateway.auth import Authenticator, KeyStoreAuthenticator
from serving.gateway.errors import GatewayError, InvalidRequestError
from serving.gateway.settings import GatewaySettings
from serving.gateway.usage_ledger.recorder import LedgerStore, TokenRecord, UsageRecorder
from serving.gateway.usage_ledger.report import (
    NameOf,
    Report,
    ReportQueryError,
    build_report,
    report_query,
)

logger = logging.getLogger(__name__)

USAGE_PATH = "/admin/v1/usage"
QUERY_PARAMS = ("from", "to", "key")
# How long a report waits for this gateway's unwritten usage before it reads anyway.
FLUSH_WAIT_S = 5.0


class UsageNotRecordedError(GatewayError):
    status = 404
    type = "invalid_request_error"
    code = "usage_not_recorded"


class UsageStoreUnavailableError(GatewayError):
    status = 503
    type = "server_error"
    code = "usage_store_unavailable"


class NotRecorded:
    """The ledger of a gateway with nowhere durable to keep usage: records nothing."""

    def record(self, record: TokenRecord, *, batch: bool = False) -> None:
        pass

    def failures(self) -> int:
        return 0

    async def close(self) -> None:
        pass


def open_ledger(settings: GatewaySettings) -> UsageRecorder | None:
    """The recorder over the deployment's store (keys.db's tables are created here; Redis is
    connected to at the first write); None when there is neither Redis nor keys.db."""
    store: LedgerStore
    retention = settings.usage_retention_days
    if settings.redis_url:
        # Imported here, like the Redis key store: a gateway without Redis does not need it.
        from serving.gateway.usage_ledger.redis_store import RedisUsageStore

        store = RedisUsageStore.from_url(settings.redis_url, retention_days=retention)
    elif settings.keys_db:
        from serving.gateway.usage_ledger.sqlite_store import SqliteUsageStore

        store = SqliteUsageStore(Path(settings.keys_db), retention_days=retention)
    else:
        return None
    return UsageRecorder(store)


def key_names(authenticator: Authenticator) -> NameOf:
    """A key id's name as the gateway's key stores know it."""
    if isinstance(authenticator, KeyStoreAuthenticator):
        return authenticator.key_name
    return lambda key_id: None


class UsageEndpoint:
    """GET /admin/v1/usage: the report over this gateway's ledger."""

    def __init__(self, recorder: UsageRecorder | None, name_of: NameOf) -> None:
        self._recorder = recorder
        self._name_of = name_of

    async def handle(self, request: AdminRequest) -> tuple[int, Report]:
        for param in request.query:
            if param not in QUERY_PARAMS:
                raise InvalidRequestError(
                    f"Unknown query parameter {param!r}: this route takes from, to and key.",
                    param=param,
                )
        try:
            query = report_query(
                request.query.get("from"), request.query.get("to"), request.query.get("key")
            )
        except ReportQueryError as exc:
            raise InvalidRequestError(f"{exc.param}: {exc}", param=exc.param) from None
        recorder = self._recorder
        if recorder is None:
            raise UsageNotRecordedError(
                "This gateway records no usage: it has neither a key database (--keys-db) "
                "nor Redis (--redis-url)."
            )
        await recorder.flush(FLUSH_WAIT_S)
        try:
            rows = await recorder.read(query.first, query.last, query.key_id)
        except Exception as exc:  # Redis down, keys.db unreadable: the operator may retry
            logger.warning("usage report: the usage store could not be read: %s", exc)
            raise UsageStoreUnavailableError(
                f"The usage store could not be read ({type(exc).__name__}); try again."
            ) from exc
        return 200, build_report(query, rows, self._name_of)


def install_usage_reports(
    settings: GatewaySettings, admin: AdminApi, authenticator: Authenticator
) -> UsageRecorder | NotRecorded:
    """Open the deployment's ledger and serve its reports on `admin`, naming keys as
    `authenticator`'s stores do; the caller closes the ledger at shutdown (`close`)."""
    recorder = open_ledger(settings)
    endpoint = UsageEndpoint(recorder, key_names(authenticator))
    admin.add("GET", USAGE_PATH, endpoint.handle)
    return recorder if recorder is not None else NotRecorded()
