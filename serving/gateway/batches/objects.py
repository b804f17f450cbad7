"""The Files and Batches API's objects as OpenAI writes them (the `openai` client parses
them: `types.FileObject`, `types.Batch`), from the rows `store.BatchStore` keeps.

    file_object(row)     # {"id": "file-...", "object": "file", "bytes": ..., ...}
    batch_object(row)    # {"id": "batch_...", "object": "batch", "status": ..., ...}
    page(objects, limit) # a list page: data, first_id, last_id, has_more

Ids are random (`new_id`), so one key's id says nothing about another's.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

BatchStatus = Literal[
    "validating",
    "in_progress",
    "finalizing",
    "completed",
    "failed",
    "expired",
    "cancelling",
    "cancelled",
]
STATUSES: tuple[BatchStatus, ...] = get_args(BatchStatus)
ENDED: frozenset[str] = frozenset({"completed", "failed", "expired", "cancelled"})
INPUT_PURPOSE = "batch"
OUTPUT_PURPOSE = "batch_output"
COMPLETION_WINDOW = "24h"
WINDOW_S = 24 * 3600
# OpenAI keeps batch files 30 days unless told otherwise.
FILE_TTL_S = 30 * 24 * 3600
TIMESTAMPS = (
    "in_progress_at",
    "finalizing_at",
    "completed_at",
    "failed_at",
    "expired_at",
    "cancelling_at",
    "cancelled_at",
)


def new_id(prefix: str) -> str:
    """A fresh id: `file-...`, `batch_...`, `batch_req_...`."""
    return prefix + secrets.token_hex(12)


@dataclass(slots=True)
class FileRow:
    id: str
    key_id: str
    filename: str
    purpose: str
    bytes: int
    created_at: int
    expires_at: int | None


@dataclass(slots=True)
class BatchRow:
    id: str
    key_id: str
    endpoint: str
    input_file_id: str
    created_at: int
    expires_at: int
    status: BatchStatus = "validating"
    metadata: dict[str, str] | None = None
    times: dict[str, int] = field(default_factory=dict)
    """The status timestamps (`TIMESTAMPS`) reached so far."""
    total: int = 0
    completed: int = 0
    failed: int = 0
    output_file_id: str | None = None
    error_file_id: str | None = None
    errors: list[dict[str, Any]] | None = None
    """Validation errors: `{code, message, param, line}` each."""


def file_object(row: FileRow) -> dict[str, Any]:
    return {
        "id": row.id,
        "object": "file",
        "bytes": row.bytes,
        "created_at": row.created_at,
        "expires_at": row.expires_at,
        "filename": row.filename,
        "purpose": row.purpose,
        "status": "processed",
        "status_details": None,
    }


def batch_object(row: BatchRow) -> dict[str, Any]:
    errors = None if row.errors is None else {"object": "list", "data": row.errors}
    return {
        "id": row.id,
        "object": "batch",
        "endpoint": row.endpoint,
        "errors": errors,
        "input_file_id": row.input_file_id,
        "completion_window": COMPLETION_WINDOW,
        "status": row.status,
        "output_file_id": row.output_file_id,
        "error_file_id": row.error_file_id,
        "created_at": row.created_at,
        "expires_at": row.expires_at,
        **{name: row.times.get(name) for name in TIMESTAMPS},
        "request_counts": {"total": row.total, "completed": row.completed, "failed": row.failed},
        "metadata": row.metadata,
    }


def page(objects: Sequence[dict[str, Any]], limit: int) -> dict[str, Any]:
    """One page of a list, `objects` holding up to `limit + 1` (the extra says there is more)."""
    data = list(objects[:limit])
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": len(objects) > limit,
    }


def dumps(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))
