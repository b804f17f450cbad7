"""A usage report: what it asks for, its one JSON shape, and that JSON as CSV or a table
(docs/usage-reports.md has the shape and the CSV rules).

    query = report_query("2026-03-01", "2026-03-31", None)   # ReportQueryError names a param
    query = report_query(None, None, None)         # this UTC month, from its first day to today
    report = build_report(query, rows, name_of)    # what GET /admin/v1/usage answers
    text = render(report, "table")                 # `serving usage report`: table, csv, json

Rules:
- the JSON is built here alone, so the endpoint and `--format json` give the same document;
- rows sort by day, key id and model, keys by key id; `key_name` is null for a key no store
  holds; `model` is the metrics label (`other` for anything the engines do not serve);
- every count is of all requests, interactive and Batch API lines alike, and comes with the
  Batch API lines' part of it (`batch` in JSON, `batch_*` CSV columns, the table's BATCH):
  interactive is the total less the batch part;
- CSV (rows only, header first): every text cell is quoted and one starting with a
  FORMULA_TRIGGERS character gets a leading `'` (CSV injection); numbers stay bare; JSON and
  the table keep names as they are.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import date
from typing import Any

from serving.gateway.auth import DEV_KEY_ID
from serving.gateway.failures import GatewayException
from serving.gateway.keys.credentials import is_key_id
from serving.gateway.usage_ledger.days import utc_today
from serving.gateway.usage_ledger.tally import UsageRow

FORMATS = ("table", "csv", "json")
# Bounds the days one report reads (one HGETALL each in Redis): ten years.
MAX_DAYS = 3660
CSV_COLUMNS = (
    "day", "key_id", "key_name", "model", "prompt_tokens", "completion_tokens", "total_tokens",
    "batch_prompt_tokens", "batch_completion_tokens", "batch_total_tokens",
)  # fmt: skip
# A count's fields, in CSV_COLUMNS's order; the batch part's CSV columns prefix them.
_COUNTS = ("prompt_tokens", "completion_tokens", "total_tokens")
# OWASP's list (= + - @ tab CR), with LF and NUL, which ASVS 1.2.10 adds.
FORMULA_TRIGGERS = ("=", "+", "-", "@", "\t", "\r", "\n", "\0")
_DAY = re.compile(r"\d{4}-\d{2}-\d{2}")
_DEV_KEY_ID = re.compile(rf"{DEV_KEY_ID}(-\d{{1,4}})?")

Report = dict[str, Any]
NameOf = Callable[[str], str | None]


class ReportQueryError(GatewayException, ValueError):
    """A bad query; `param` names it (`from`, `to`, `key`), the message does not."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class ReportQuery:
    first: str
    last: str
    key_id: str | None = None


def report_query(first: str | None, last: str | None, key_id: str | None) -> ReportQuery:
    """The days from `first` to `last` (YYYY-MM-DD, UTC, both included), of one key or all.

    `last` defaults to today and `first` to the first day of `last`'s month: neither given is
    the current month so far, the bill still running up; `last` alone is its month up to it.
    None is a value not given; an empty string is given, and not a day."""
    end = utc_today() if last is None else _day("to", last)
    start = end.replace(day=1) if first is None else _day("from", first)
    # Without `to`, a bad range is `from`'s doing: the error names the one the user gave.
    if end < start and last is None:
        raise ReportQueryError("from", f"{start} is after today ({end})")
    if end < start:
        raise ReportQueryError("to", f"{end} is before the first day ({start})")
    if (end - start).days >= MAX_DAYS:
        param = "to" if last is not None else "from"
        raise ReportQueryError(param, f"a report covers at most {MAX_DAYS} days")
    if key_id is not None and not (is_key_id(key_id) or _DEV_KEY_ID.fullmatch(key_id)):
        # Not echoed: a secret pasted by mistake must not travel on.
        raise ReportQueryError("key", "is not a key id (e.g. key_5e01c9a7, or dev)")
    return ReportQuery(start.isoformat(), end.isoformat(), key_id)


def _day(param: str, text: str) -> date:
    try:
        if not _DAY.fullmatch(text):
            raise ValueError(text)
        return date.fromisoformat(text)
    except ValueError:
        raise ReportQueryError(param, f"{text[:40]!r} is not a day (YYYY-MM-DD)") from None


def _tokens(prompt: int, completion: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _counts_of(counts: list[int]) -> dict[str, Any]:
    """[prompt, completion, batch prompt, batch completion] as the report shows them."""
    return {**_tokens(counts[0], counts[1]), "batch": _tokens(counts[2], counts[3])}


def _sum(entries: Iterable[list[int]]) -> list[int]:
    return [sum(column) for column in zip(*entries, strict=True)] or [0, 0, 0, 0]


def build_report(query: ReportQuery, rows: Iterable[UsageRow], name_of: NameOf) -> Report:
    """The report's JSON (see the module docstring); `name_of` gives a key id's name."""
    names: dict[str, str | None] = {}

    def name(key_id: str) -> str | None:
        if key_id not in names:
            names[key_id] = name_of(key_id)
        return names[key_id]

    listed: list[dict[str, Any]] = []
    per_key: dict[str, dict[str, list[int]]] = {}
    for row in sorted(rows):
        row_counts = list(row[3:])
        listed.append(
            {"day": row.day, "key_id": row.key_id, "key_name": name(row.key_id),
             "model": row.model, **_counts_of(row_counts)}
        )  # fmt: skip
        counts = per_key.setdefault(row.key_id, {}).setdefault(row.model, [0, 0, 0, 0])
        for at, tokens in enumerate(row_counts):
            counts[at] += tokens
    keys: list[dict[str, Any]] = []
    for key_id in sorted(per_key):
        models = per_key[key_id]
        keys.append(
            {"key_id": key_id, "key_name": name(key_id), **_counts_of(_sum(models.values())),
             "models": [{"model": model, **_counts_of(models[model])} for model in sorted(models)]}
        )  # fmt: skip
    total = _counts_of(_sum(counts for models in per_key.values() for counts in models.values()))
    return {
        "object": "usage_report",
        "from": query.first,
        "to": query.last,
        "key_id": query.key_id,
        "rows": listed,
        "keys": keys,
        "total": total,
    }


def render(report: Report, form: str) -> str:
    """The report as `serving usage report` prints it (`form` one of FORMATS)."""
    if form == "json":
        return json.dumps(report, indent=2) + "\n"
    if form == "csv":
        return render_csv(report)
    if form == "table":
        return render_table(report)
    raise ValueError(f"not a report format: {form!r}")


def render_csv(report: Report) -> str:
    out = io.StringIO()
    # QUOTE_NONNUMERIC quotes every str and no int: the text cells, and only those.
    writer = csv.writer(out, lineterminator="\n", quoting=csv.QUOTE_NONNUMERIC)
    writer.writerow(CSV_COLUMNS)
    for row in report["rows"]:
        cells = [_cell(row[column]) for column in CSV_COLUMNS[: -len(_COUNTS)]]
        writer.writerow([*cells, *(row["batch"][count] for count in _COUNTS)])
    return out.getvalue()


def _cell(value: str | int | None) -> str | int:
    """A CSV cell, with text a spreadsheet would run as a formula made plain text (see the
    module docstring). Decided by type, not by look: a count of -5 stays a number, a name
    "-5" is text and stays text."""
    if value is None:
        return ""
    if isinstance(value, str) and value.startswith(FORMULA_TRIGGERS):
        return "'" + value
    return value


def render_table(report: Report) -> str:
    whose = f"key {report['key_id']}" if report["key_id"] else "all keys"
    heading = f"usage from {report['from']} to {report['to']} (UTC), {whose}"
    if not report["rows"]:
        return f"{heading}: none\n"
    numbers = ("PROMPT", "COMPLETION", "TOTAL", "BATCH")
    days: list[tuple[str, ...]] = [("DAY", "KEY_ID", "NAME", "MODEL", *numbers)]
    days += [
        (row["day"], row["key_id"], row["key_name"] or "-", row["model"], *_counts(row))
        for row in report["rows"]
    ]
    keys: list[tuple[str, ...]] = [("KEY_ID", "NAME", *numbers)]
    keys += [(key["key_id"], key["key_name"] or "-", *_counts(key)) for key in report["keys"]]
    keys.append(("all", "", *_counts(report["total"])))
    return "\n".join([heading, "", *_aligned(days, 4), "", *_aligned(keys, 2)]) + "\n"


def _counts(entry: dict[str, Any]) -> tuple[str, ...]:
    """A table's numbers: the totals, then the batch part of the total."""
    return (*(str(entry[count]) for count in _COUNTS), str(entry["batch"]["total_tokens"]))


def _aligned(rows: list[tuple[str, ...]], texts: int) -> list[str]:
    """Columns padded to their widest cell: the first `texts` left-aligned, numbers right."""
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return [
        "  ".join(
            cell.ljust(width) if column < texts else cell.rjust(width)
            for column, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]
