"""`serving usage report`: the tokens each key used, per model and UTC day, from the ledger
the gateways write (keys.db, or Redis with `--redis-url`).

    serving usage report                    # this UTC month, from its first day to today
    serving usage report --from 2026-03-01 --to 2026-03-31
    serving usage report --from 2026-03-01 --to 2026-03-31 --key key_5e01c9a7 --format csv
    serving usage report --from 2026-03-01 --to 2026-03-31 --format json --redis-url URL

`--to` defaults to today and `--from` to the first day of `--to`'s month (`report_query`).
`--format json` prints the document GET /admin/v1/usage answers (`usage_ledger.report`);
key names come from the key store beside the ledger (keys.db, or the keys in that Redis).
CSV cells a spreadsheet would run as formulas are written as text (`report.render_csv`).
Bad input is one line naming the flag, and exit status 2. The Redis URL is never printed.
Store modules are imported inside `run`, so `serving --help` stays instant.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from serving import paths
from serving.errors import ServingError

if TYPE_CHECKING:
    from serving.gateway.keys.record import KeyRecord
    from serving.gateway.usage_ledger.report import NameOf, ReportQuery
    from serving.gateway.usage_ledger.tally import UsageRow

FLAGS = {"from": "--from", "to": "--to", "key": "--key"}
FORMATS = ("table", "csv", "json")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="usage_command", required=True, metavar="ACTION")
    report = actions.add_parser(
        "report", help="tokens per key, model and UTC day, with totals per key and in all"
    )
    # Checked in `run`, not by argparse, so that a bad value is one line too.
    report.add_argument(
        "--from",
        dest="first",
        metavar="YYYY-MM-DD",
        help="first UTC day (default: the first day of --to's month)",
    )
    report.add_argument(
        "--to", dest="last", metavar="YYYY-MM-DD", help="last UTC day, included (default: today)"
    )
    report.add_argument("--key", metavar="KEY_ID", help="one key only, e.g. key_5e01c9a7")
    report.add_argument(
        "--format", default="table", metavar="{table,csv,json}", help="default: table"
    )
    where = report.add_mutually_exclusive_group()
    where.add_argument(
        "--keys-db",
        type=Path,
        default=None,
        metavar="PATH",
        help=f"the gateways' key database (default: {paths.keys_db_path()})",
    )
    where.add_argument(
        "--redis-url",
        metavar="URL",
        default=None,
        help="the usage the gateways given the same --redis-url recorded in Redis (never printed)",
    )


def run(args: argparse.Namespace) -> int:
    from serving.gateway.usage_ledger.report import (
        ReportQueryError,
        build_report,
        render,
        report_query,
    )

    try:
        query = report_query(args.first, args.last, args.key)
    except ReportQueryError as exc:
        raise ServingError(f"{FLAGS[exc.param]}: {exc}") from None
    if args.format not in FORMATS:
        raise ServingError(f"--format: {args.format[:40]!r} is not one of {', '.join(FORMATS)}")
    if args.redis_url is not None:
        rows, name_of = _from_redis(args.redis_url, query)
    else:
        rows, name_of = _from_file(args.keys_db or paths.keys_db_path(), query)
    sys.stdout.write(render(build_report(query, rows, name_of), args.format))
    return 0


def _from_file(path: Path, query: ReportQuery) -> tuple[list[UsageRow], NameOf]:
    import sqlite3

    from serving.gateway.keys.sqlite_store import SqliteKeyStore
    from serving.gateway.usage_ledger.sqlite_store import read_usage_file

    try:
        rows = read_usage_file(path, query.first, query.last, query.key_id)
    except FileNotFoundError:
        raise ServingError(f"--keys-db: {path} does not exist") from None
    except sqlite3.Error as exc:
        raise ServingError(f"--keys-db: {path} cannot be read: {exc}") from None
    names: dict[str, str | None] = {}
    if rows:
        keys = SqliteKeyStore(path)
        try:
            names = {row.key_id: _name(keys.get(row.key_id)) for row in rows}
        finally:
            keys.close()
    return rows, names.get


def _from_redis(url: str, query: ReportQuery) -> tuple[list[UsageRow], NameOf]:
    from serving.gateway.keys.redis_store import KeyStoreUnavailable, RedisKeyStore
    from serving.gateway.quota.redis_connection import RedisError
    from serving.gateway.usage_ledger.redis_store import RedisUsageStore

    try:
        store = RedisUsageStore.from_url(url)
        keys = RedisKeyStore.from_url(url)
    except (ValueError, ServingError) as exc:  # a bad URL; the message does not quote it
        raise ServingError(f"--redis-url: {exc}") from None

    async def read() -> tuple[list[UsageRow], dict[str, str | None]]:
        try:
            rows = await store.read(query.first, query.last, query.key_id)
            names: dict[str, str | None] = {}
            if rows:
                await keys.refresh()
                names = {row.key_id: _name(keys.get(row.key_id)) for row in rows}
            return rows, names
        finally:
            await store.close()
            await keys.aclose()

    try:
        rows, names = asyncio.run(read())
    except (RedisError, KeyStoreUnavailable) as exc:  # neither names the URL or password
        raise ServingError(f"--redis-url: {exc}") from None
    return rows, names.get


def _name(record: KeyRecord | None) -> str | None:
    return record.name if record is not None else None
