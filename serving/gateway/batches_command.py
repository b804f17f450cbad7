"""`serving batches list`: every key's batches, for operators, from the batch database the
gateway keeps beside keys.db (docs/batches.md, operations).

    serving batches list                          # newest first, every key and status
    serving batches list --status in_progress --key key_5e01c9a7
    serving batches list --json                   # OpenAI's Batch objects, with key_name

`--batch-db` defaults to batches.db beside `--keys-db` (itself `serving.paths.keys_db_path()`
by default), as the gateway's does; key names come from that keys.db. Bad input is one line
naming the flag, and exit status 2. Store modules are imported inside `run`, so
`serving --help` stays instant.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from serving import paths
from serving.errors import ServingError

if TYPE_CHECKING:
    from serving.gateway.batches.objects import BatchRow

HEADER = ("ID", "KEY", "NAME", "STATUS", "TOTAL", "DONE", "FAILED", "CREATED", "ENDPOINT")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="batches_command", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="every key's batches, newest first")
    listing.add_argument("--status", metavar="STATUS", help="only batches in this status")
    listing.add_argument("--key", metavar="KEY_ID", help="one key's only, e.g. key_5e01c9a7")
    listing.add_argument("--json", action="store_true", help="a JSON list of Batch objects")
    listing.add_argument(
        "--keys-db",
        type=Path,
        default=None,
        metavar="PATH",
        help=f"the gateway's key database, for key names (default: {paths.keys_db_path()})",
    )
    listing.add_argument(
        "--batch-db",
        type=Path,
        default=None,
        metavar="PATH",
        help="the gateway's batch database (default: batches.db beside --keys-db)",
    )


def run(args: argparse.Namespace) -> int:
    from serving.gateway.batches.objects import STATUSES, batch_object
    from serving.gateway.batches.store import DB_NAME, BatchStore

    if args.status is not None and args.status not in STATUSES:
        raise ServingError(f"--status: {args.status[:40]!r} is not one of {', '.join(STATUSES)}")
    keys_db: Path = args.keys_db or paths.keys_db_path()
    batch_db: Path = args.batch_db or keys_db.parent / DB_NAME
    if not batch_db.is_file():
        raise ServingError(f"--batch-db: {batch_db} does not exist")
    store = BatchStore(batch_db)
    try:
        rows = store.every_batch(status=args.status, key_id=args.key)
    finally:
        store.close()
    names = _names(keys_db, {row.key_id for row in rows})
    if args.json:
        found = [batch_object(row) | {"key_name": names.get(row.key_id)} for row in rows]
        sys.stdout.write(json.dumps(found, indent=2) + "\n")
    else:
        _print_table(rows, names)
    return 0


def _names(keys_db: Path, key_ids: set[str]) -> dict[str, str]:
    """The names of the keys in keys.db (none when it is missing)."""
    if not key_ids or not keys_db.is_file():
        return {}
    from serving.gateway.keys.sqlite_store import SqliteKeyStore

    keys = SqliteKeyStore(keys_db)
    try:
        records = (keys.get(key_id) for key_id in key_ids)
        return {record.key_id: record.name for record in records if record is not None}
    finally:
        keys.close()


def _print_table(rows: list[BatchRow], names: dict[str, str]) -> None:
    if not rows:
        print("no batches")
        return
    table: list[tuple[str, ...]] = [HEADER]
    for row in rows:
        created = datetime.fromtimestamp(row.created_at, UTC).strftime("%Y-%m-%d %H:%M")
        counts = (str(row.total), str(row.completed), str(row.failed))
        name = names.get(row.key_id, "-")
        table.append((row.id, row.key_id, name, row.status, *counts, created, row.endpoint))
    widths = [max(len(line[column]) for line in table) for column in range(len(HEADER))]
    for line in table:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        )
