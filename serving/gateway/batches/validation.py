"""An input file checked line by line before its batch runs (the batch's `validating`
status): each line a JSON object with a unique string `custom_id`, `method` POST, `url` the
batch's endpoint, and a `body` that passes the interactive route's checks
(`openai_request.parse_completion_request`) for a model the key may use and the engines
serve. Any failure fails the whole batch, with OpenAI's `{code, message, param, line}`
entries (lines numbered from 1); nothing runs and nothing is charged.

    with open(path, "rb") as lines:   # read line by line, never whole
        requests, errors = validate(lines, endpoint="/v1/chat/completions", check=body_check)
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from serving.gateway.errors import GatewayError, UpstreamError
from serving.gateway.request_fields import Kind

# The batch endpoints, each metered as the route of the same path (route_table).
ENDPOINTS: dict[str, Kind] = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completion",
    "/v1/embeddings": "embeddings",
    "/v1/responses": "responses",
}
# A file of bad lines gets this many entries, enough to fix it by, not one per line.
MAX_ERRORS = 100

BodyCheck = Callable[[Kind, bytes], None]
"""Raises the interactive route's `GatewayError` for a body it would refuse."""


@dataclass(frozen=True, slots=True)
class BatchLine:
    line: int
    """1-based, as the errors number them."""
    custom_id: str
    body: bytes


def error(
    code: str, message: str, *, line: int | None = None, param: str | None = None
) -> dict[str, Any]:
    return {"code": code, "message": message, "param": param, "line": line}


def validate(
    data: Iterable[bytes], *, endpoint: str, check: BodyCheck, max_lines: int
) -> tuple[list[BatchLine], list[dict[str, Any]]]:
    """The request lines of `data` (a file's lines), and the errors that fail the batch
    (empty: it may run)."""
    kind = ENDPOINTS[endpoint]
    lines: list[BatchLine] = []
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    for number, raw in enumerate(data, start=1):
        if len(errors) >= MAX_ERRORS:
            break
        if not raw.strip():
            continue
        if len(lines) >= max_lines:
            return [], [
                error(
                    "too_many_requests",
                    f"The file has more than {max_lines} requests; split it into several batches.",
                    line=number,
                )
            ]
        found = _line(raw, number, endpoint, kind, check, seen)
        if isinstance(found, BatchLine):
            lines.append(found)
        else:
            errors.append(found)
    if not lines and not errors:
        errors.append(error("empty_file", "The input file has no request lines."))
    return lines, errors


def _line(
    raw: bytes, number: int, endpoint: str, kind: Kind, check: BodyCheck, seen: set[str]
) -> BatchLine | dict[str, Any]:
    try:
        item = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return error("invalid_json_line", "This line is not parseable as valid JSON.", line=number)
    if not isinstance(item, dict):
        return error("invalid_json_line", "This line is not a JSON object.", line=number)
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return _missing("custom_id", "a non-empty string", number)
    if custom_id in seen:
        return error(
            "duplicate_custom_id",
            f"The custom_id `{custom_id}` is used by an earlier line; each must be unique.",
            line=number,
            param="custom_id",
        )
    seen.add(custom_id)
    if item.get("method") != "POST":
        return error("invalid_method", "The method must be POST.", line=number, param="method")
    if item.get("url") != endpoint:
        return error(
            "invalid_url",
            f"The url must be the batch's endpoint, {endpoint}.",
            line=number,
            param="url",
        )
    body = item.get("body")
    if not isinstance(body, dict):
        return _missing("body", "an object", number)
    if body.get("stream"):
        return error(
            "invalid_request", "Batch requests cannot stream.", line=number, param="body.stream"
        )
    encoded = json.dumps(body, separators=(",", ":")).encode()
    try:
        check(kind, encoded)
    except UpstreamError:
        raise  # not the line's fault: validation is tried again later
    except GatewayError as exc:
        param = f"body.{exc.param}" if exc.param else "body"
        return error(exc.code or "invalid_request", exc.message, line=number, param=param)
    return BatchLine(number, custom_id, encoded)


def _missing(param: str, what: str, number: int) -> dict[str, Any]:
    return error(
        "missing_required_parameter", f"`{param}` must be {what}.", line=number, param=param
    )
