"""The Files and Batches routes (`/v1/files...`, `/v1/batches...`), answered by the gateway
for the calling key alone: another key's id is answered exactly as a missing one (404).

    api = BatchApi(store, contents, runner, owners, limits=Limits(...))
    await api.serve(caller, method, path, query, headers, receive, send, rid)

Errors are raised as `GatewayError`s; the app's error boundary words them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from serving.gateway.auth import Caller
from serving.gateway.batches.contents import FileContents
from serving.gateway.batches.objects import (
    COMPLETION_WINDOW,
    FILE_TTL_S,
    INPUT_PURPOSE,
    WINDOW_S,
    BatchRow,
    FileRow,
    batch_object,
    file_object,
    new_id,
    page,
)
from serving.gateway.batches.owners import Owners
from serving.gateway.batches.runner import BatchRunner
from serving.gateway.batches.store import BatchStore
from serving.gateway.batches.upload import read_upload
from serving.gateway.batches.validation import ENDPOINTS
from serving.gateway.errors import GatewayError, InvalidRequestError, RouteNotFoundError
from serving.gateway.openai_request import read_json_body
from serving.gateway.request_body import read_body
from serving.gateway.responses import send_json
from serving.gateway.route_table import wrong_method
from serving.gateway.types import RawHeaders, Receive, Send

FILES = "/v1/files"
BATCHES = "/v1/batches"
_CHUNK = 1 << 20
_MAX_METADATA = 16


class NotFoundError(GatewayError):
    status = 404
    type = "invalid_request_error"
    code = None


@dataclass(frozen=True, slots=True)
class Limits:
    max_file_bytes: int
    max_body_bytes: int


class BatchApi:
    def __init__(
        self,
        store: BatchStore,
        contents: FileContents,
        runner: BatchRunner,
        owners: Owners,
        *,
        limits: Limits,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._contents = contents
        self._runner = runner
        self._owners = owners
        self._limits = limits
        self._clock = clock

    async def serve(
        self,
        caller: Caller,
        method: str,
        path: str,
        query: bytes,
        headers: RawHeaders,
        receive: Receive,
        send: Send,
        rid: bytes,
    ) -> None:
        self._owners.remember(caller)
        key = caller.key_id
        parts = path.rstrip("/").split("/")[1:]  # ["v1", "files", id, "content"]
        params = {name: values[-1] for name, values in parse_qs(query.decode()).items()}
        name = _route_name(parts)
        allowed = _METHODS.get(name, ())
        if not allowed:
            raise RouteNotFoundError(f"Invalid URL ({method} {path})")
        if method not in allowed:
            raise wrong_method(method, path, allowed[0])
        answer: dict[str, Any]
        if name == "content":
            await self._content(key, parts[2], send, rid)
            return
        if name == "files":
            if method == "POST":
                answer = await self._upload(key, headers, receive)
            else:
                answer = self._list_files(key, params)
        elif name == "file":
            if method == "DELETE":
                answer = self._delete_file(key, parts[2])
            else:
                answer = file_object(self._file(key, parts[2]))
        elif name == "batches":
            if method == "POST":
                answer = await self._create(key, receive, headers)
            else:
                answer = self._list_batches(key, params)
        elif name == "batch":
            answer = batch_object(self._batch(key, parts[2]))
        else:
            answer = self._cancel(key, parts[2])
        await send_json(send, 200, answer, request_id=rid)

    async def _upload(self, key: str, headers: RawHeaders, receive: Receive) -> dict[str, Any]:
        content_type = next((value for name, value in headers if name == b"content-type"), None)
        with self._contents.writer() as sink:
            upload = await read_upload(
                receive, content_type, sink, limit=self._limits.max_file_bytes
            )
            purpose = upload.fields.get("purpose")
            if purpose != INPUT_PURPOSE:
                raise InvalidRequestError(
                    f"'purpose' must be '{INPUT_PURPOSE}' (the only purpose served here), "
                    f"got {purpose!r}.",
                    param="purpose",
                )
            now = int(self._clock())
            row = FileRow(
                new_id("file-"),
                key,
                upload.filename or "upload.jsonl",
                purpose,
                upload.size,
                now,
                now + FILE_TTL_S,
            )
            self._contents.commit(sink, row.id)
        self._store.add_file(row)
        return file_object(row)

    def _list_files(self, key: str, params: dict[str, str]) -> dict[str, Any]:
        limit = _limit(params, default=10_000, most=10_000)
        order = params.get("order", "desc")
        if order not in ("asc", "desc"):
            raise InvalidRequestError("'order' must be 'asc' or 'desc'.", param="order")
        rows = self._store.list_files(
            key,
            limit=limit + 1,
            after=params.get("after"),
            ascending=order == "asc",
            purpose=params.get("purpose"),
        )
        return page([file_object(row) for row in rows], limit)

    def _file(self, key: str, file_id: str) -> FileRow:
        row = self._store.get_file(key, file_id)
        if row is None:
            raise NotFoundError(f"No such File object: {file_id}", param="id")
        return row

    def _delete_file(self, key: str, file_id: str) -> dict[str, Any]:
        if not self._store.delete_file(key, file_id):
            raise NotFoundError(f"No such File object: {file_id}", param="id")
        self._contents.delete(file_id)
        return {"id": file_id, "object": "file", "deleted": True}

    async def _content(self, key: str, file_id: str, send: Send, rid: bytes) -> None:
        row = self._file(key, file_id)
        with open(self._contents.path(row.id), "rb") as handle:
            size = handle.seek(0, 2)
            handle.seek(0)
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [
                        (b"content-type", b"application/octet-stream"),
                        (b"content-length", str(size).encode()),
                        (b"x-request-id", rid),
                    ],
                }
            )
            while chunk := handle.read(_CHUNK):
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _create(self, key: str, receive: Receive, headers: RawHeaders) -> dict[str, Any]:
        length = next((value for name, value in headers if name == b"content-length"), None)
        data = read_json_body(await read_body(receive, self._limits.max_body_bytes, length))
        if not isinstance(data, dict):
            raise InvalidRequestError("The body must be a JSON object.")
        file_id = data.get("input_file_id")
        found = self._store.get_file(key, file_id) if isinstance(file_id, str) else None
        if found is None or found.purpose != INPUT_PURPOSE:
            raise InvalidRequestError(
                f"'input_file_id' {file_id!r} is not a file of purpose 'batch' of this key.",
                param="input_file_id",
            )
        endpoint = data.get("endpoint")
        if endpoint not in ENDPOINTS:
            raise InvalidRequestError(
                f"'endpoint' must be one of {', '.join(ENDPOINTS)}, got {endpoint!r}.",
                param="endpoint",
            )
        if data.get("completion_window") != COMPLETION_WINDOW:
            raise InvalidRequestError(
                f"'completion_window' must be '{COMPLETION_WINDOW}'.", param="completion_window"
            )
        metadata = data.get("metadata")
        if metadata is not None and not _is_metadata(metadata):
            raise InvalidRequestError(
                f"'metadata' must be an object of at most {_MAX_METADATA} string values.",
                param="metadata",
            )
        now = int(self._clock())
        row = BatchRow(
            new_id("batch_"), key, endpoint, found.id, now, now + WINDOW_S, metadata=metadata
        )
        self._store.add_batch(row)
        self._runner.wake()
        return batch_object(row)

    def _list_batches(self, key: str, params: dict[str, str]) -> dict[str, Any]:
        limit = _limit(params, default=20, most=100)
        rows = self._store.list_batches(key, limit=limit + 1, after=params.get("after"))
        return page([batch_object(row) for row in rows], limit)

    def _batch(self, key: str, batch_id: str) -> BatchRow:
        row = self._store.get_batch(key, batch_id)
        if row is None:
            raise NotFoundError(f"No such Batch object: {batch_id}", param="id")
        return row

    def _cancel(self, key: str, batch_id: str) -> dict[str, Any]:
        row = self._batch(key, batch_id)
        if row.status in ("validating", "in_progress"):
            expected = row.status
            row.status = "cancelling"
            row.times["cancelling_at"] = int(self._clock())
            if self._store.save_batch(row, expected):
                self._runner.wake()
            else:
                row = self._batch(key, batch_id)  # the runner moved it on first
        if row.status not in ("cancelling", "cancelled"):
            raise InvalidRequestError(
                f"A batch that is {row.status} cannot be cancelled.", param="id"
            )
        return batch_object(row)


_METHODS: dict[str, tuple[str, ...]] = {
    "files": ("GET", "POST"),
    "file": ("GET", "DELETE"),
    "content": ("GET",),
    "batches": ("GET", "POST"),
    "batch": ("GET",),
    "cancel": ("POST",),
}


def _route_name(parts: list[str]) -> str:
    """Which of the routes `/v1/files...` or `/v1/batches...` the path's parts name."""
    family = parts[1] if len(parts) > 1 else ""
    if len(parts) == 2:
        return family
    if len(parts) == 3:
        return {"files": "file", "batches": "batch"}.get(family, "")
    if len(parts) == 4:
        return {("files", "content"): "content", ("batches", "cancel"): "cancel"}.get(
            (family, parts[3]), ""
        )
    return ""


def _limit(params: dict[str, str], *, default: int, most: int) -> int:
    text = params.get("limit")
    if text is None:
        return default
    if not text.isdigit() or not 1 <= int(text) <= most:
        raise InvalidRequestError(f"'limit' must be between 1 and {most}.", param="limit")
    return int(text)


def _is_metadata(value: object) -> bool:
    return (
        isinstance(value, dict)
        and len(value) <= _MAX_METADATA
        and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())
    )
