"""The Batch API built from the settings, or nothing when there is nowhere to keep it.

    batches = install_batches(settings, completions, catalog, quota=..., find_owner=...,
                              observe=..., written=usage.flush)
    batches.api.serve(...); batches.runner.start(); await batches.close()
    gateway_metrics.add_source(batches.metrics.families)   # the batch series

The database is `batch_db`, else batches.db beside keys.db; the contents `batch_files_dir`,
else batch-files beside the database. Without either path (no keys.db) it is not served.
A line's run returns to the runner only once `written` says its charge (observed through
`observe`, the usage ledger's) is in the ledger's store, and a run a dead gateway cut is
charged through the same two.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from serving.gateway.auth import Caller
from serving.gateway.batches.api import BatchApi, Limits
from serving.gateway.batches.attempts import Attempt, line_reservation
from serving.gateway.batches.contents import FileContents
from serving.gateway.batches.line_call import LineResult, call_line
from serving.gateway.batches.metrics import BatchMetrics
from serving.gateway.batches.owners import Owners
from serving.gateway.batches.runner import BatchRunner, CheckFor
from serving.gateway.batches.store import DB_NAME, BatchStore
from serving.gateway.batches.validation import BodyCheck
from serving.gateway.catalog import ModelCatalog
from serving.gateway.completions import Completions, served_model
from serving.gateway.errors import ModelNotFoundError, UpstreamUnavailableError
from serving.gateway.images import ImagePolicy
from serving.gateway.metrics import RequestRecord
from serving.gateway.openai_request import check_admitted, parse_completion_request
from serving.gateway.quota import QuotaEngine
from serving.gateway.request_fields import Kind
from serving.gateway.settings import GatewaySettings

FILES_DIR_NAME = "batch-files"
Written = Callable[[float], Awaitable[bool]]
"""Waits (up to a timeout) until every charge observed so far is written: True if it is."""
WRITE_WAIT_S = 5.0
"""How long one wait for the ledger's store lasts before it is logged and waited again."""

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Batches:
    api: BatchApi
    runner: BatchRunner
    store: BatchStore
    metrics: BatchMetrics

    async def close(self) -> None:
        await asyncio.to_thread(self.store.close)


def batch_paths(settings: GatewaySettings) -> tuple[Path, Path] | None:
    """Where the database and the files' contents are kept; None: nowhere."""
    if settings.batch_db:
        db = Path(settings.batch_db)
    elif settings.keys_db:
        db = Path(settings.keys_db).parent / DB_NAME
    else:
        return None
    files = Path(settings.batch_files_dir) if settings.batch_files_dir else None
    return db, files or db.parent / FILES_DIR_NAME


def install_batches(
    settings: GatewaySettings,
    completions: Completions,
    catalog: ModelCatalog,
    *,
    quota: QuotaEngine,
    find_owner: Callable[[str], Caller | None] | None,
    observe: Callable[[RequestRecord], None],
    written: Written | None,
) -> Batches | None:
    paths = batch_paths(settings)
    if paths is None:
        return None
    store = BatchStore(paths[0])
    contents = FileContents(paths[1])
    owners = Owners(find_owner)
    metrics = BatchMetrics(store)

    def observe_line(record: RequestRecord) -> None:
        metrics.observe(record)
        observe(record)

    async def charges_written() -> None:
        while written is not None and not await written(WRITE_WAIT_S):
            logger.warning("batch lines wait for the usage ledger to write their charges")

    async def execute(kind: Kind, caller: Caller, body: bytes, path: str, rid: str) -> LineResult:
        result = await call_line(
            completions,
            kind,
            caller,
            body,
            path,
            request_id=rid,
            observe=observe_line,
            retry_after_s=settings.retry_after_s,
        )
        await charges_written()
        return result

    def reserve(kind: Kind, caller: Caller, body: bytes) -> tuple[str, int, int]:
        return line_reservation(
            quota,
            catalog,
            caller,
            kind,
            body,
            images=completions.images,
            max_inputs=settings.max_pooling_inputs,
            retry_after_s=settings.retry_after_s,
        )

    async def charge_cut(attempt: Attempt) -> None:
        record = RequestRecord(time.perf_counter())  # status 0: counted as cut (499)
        record.key, record.model = attempt.key_id, attempt.model
        record.prompt_tokens, record.completion_tokens = (
            attempt.prompt_tokens,
            attempt.completion_tokens,
        )
        observe_line(record)
        await charges_written()

    runner = BatchRunner(
        store,
        contents,
        owners,
        execute=execute,
        reserve=reserve,
        charge_cut=charge_cut,
        check_for=body_checks(
            catalog,
            images=completions.images,
            max_inputs=settings.max_pooling_inputs,
            retry_after_s=settings.retry_after_s,
        ),
        concurrency=settings.batch_concurrency,
        max_lines=settings.max_batch_lines,
        count_line=metrics.count_line,
    )
    limits = Limits(settings.max_batch_file_bytes, settings.max_body_bytes)
    api = BatchApi(store, contents, runner, owners, limits=limits)
    return Batches(api, runner, store, metrics)


def body_checks(
    catalog: ModelCatalog, *, images: ImagePolicy, max_inputs: int, retry_after_s: float
) -> CheckFor:
    """A line body's checks for a key: the interactive route's, before anything is reserved
    (fields, max_tokens, schemas), and a model the key may use that an engine lists."""

    def check_for(caller: Caller) -> BodyCheck:
        def check(kind: Kind, body: bytes) -> None:
            parsed = parse_completion_request(kind, body, images=images, max_inputs=max_inputs)
            if not catalog.known:  # validation waits for the engines' lists
                raise UpstreamUnavailableError("No model list yet.", retry_after_s=retry_after_s)
            model = served_model(caller, parsed.model, catalog, retry_after_s=retry_after_s)
            if not caller.allows_model(model) or catalog.label(model) != model:
                raise ModelNotFoundError(parsed.model)
            check_admitted(parsed)

        return check

    return check_for
