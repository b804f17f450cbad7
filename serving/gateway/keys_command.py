"""`serving keys`: create, list, show and revoke API keys in the embedded key store or Redis.

    serving keys create --name team-a --rpm 60 --tpm 20000 --max-concurrency 4
    serving keys create --name team-b --emit-yaml >> keys.yaml   # for a Kubernetes Secret
    serving keys list | show KEY_ID | revoke KEY_ID
    serving keys create --name team-c --redis-url redis://:PASSWORD@redis:6379/0

Secrets are printed once, at creation; the store keeps only their SHA-256. The default store
is `serving.paths.keys_db_path()`, the file a gateway started by `serving up` or `make up`
reads. With `--redis-url` every action works on the keys in that Redis instead, the ones
gateways started with the same `--redis-url` share (`keys.redis_store`); the URL is never
printed, since it may hold a password. Store modules are imported inside `run`, so
`serving --help` stays instant and the SQLite path does not import the Redis client.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from serving import paths
from serving.errors import ServingError

if TYPE_CHECKING:
    from serving.gateway.keys.record import KeyRecord, KeySpec
    from serving.gateway.keys.store import WritableKeyStore
    from serving.gateway.quota.limits import Limits

# flag -> Limits field
LIMIT_FLAGS = {
    "--rpm": "rpm",
    "--tpm": "tpm",
    "--tokens-per-day": "tokens_per_day",
    "--tokens-per-month": "tokens_per_month",
    "--max-concurrency": "max_concurrency",
    "--max-tokens": "max_tokens",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common = argparse.ArgumentParser(add_help=False)
    where = common.add_mutually_exclusive_group()
    where.add_argument(
        "--store",
        type=Path,
        default=None,
        help=f"key database (default: {paths.keys_db_path()}, which the gateway reads)",
    )
    where.add_argument(
        "--redis-url",
        metavar="URL",
        default=None,
        help="the keys in this Redis instead, shared by the gateways given the same "
        "--redis-url (redis://[:PASSWORD@]HOST[:PORT][/DB]; never printed)",
    )
    actions = parser.add_subparsers(dest="keys_command", required=True, metavar="ACTION")

    create = actions.add_parser(
        "create", parents=[common], help="create a key and print its secret once"
    )
    create.add_argument("--name", required=True, help="who or what the key is for")
    for flag, field in LIMIT_FLAGS.items():
        create.add_argument(flag, dest=field, metavar="N", help=f"limit {field} (default: none)")
    create.add_argument(
        "--models", default="", help="comma-separated models the key may use (default: all)"
    )
    create.add_argument(
        "--model-limit",
        action="append",
        default=[],
        metavar="MODEL:NAME=N,...",
        help="extra limits for one model, e.g. qwen3-tiny:rpm=10,tpm=5000 (repeatable)",
    )
    create.add_argument(
        "--weight",
        type=int,
        default=1,
        metavar="N",
        help="share of the engine under fair sharing, against the other waiting keys "
        "(1-1000, default: 1)",
    )
    create.add_argument(
        "--default-adapter",
        metavar="ADAPTER",
        help="a LoRA adapter that serves this key's requests for a base model (in --models "
        "when that is given), so the key gets its fine-tune under the base model's name",
    )
    create.add_argument(
        "--priority",
        type=int,
        default=0,
        metavar="N",
        help="vLLM's priority for the key's requests, lower first (-100 to 100, default: 0); "
        "sent when the gateway runs with --engine-priority",
    )
    create.add_argument(
        "--emit-yaml",
        action="store_true",
        help="print a keys-file entry (for a Kubernetes Secret) instead of storing the key",
    )

    actions.add_parser("list", parents=[common], help="list keys (never their secrets)")
    for name, help_text in (("show", "show one key"), ("revoke", "revoke a key at once")):
        action = actions.add_parser(name, parents=[common], help=help_text)
        action.add_argument("key_id", metavar="KEY_ID", help="public id, e.g. key_ab12cd34")


def run(args: argparse.Namespace) -> int:
    if args.keys_command == "create" and args.emit_yaml:
        return _emit_yaml(args)
    if args.redis_url is not None:
        return _run_on_redis(args)
    from serving.gateway.keys.sqlite_store import SqliteKeyStore

    store = SqliteKeyStore(args.store or paths.keys_db_path())
    try:
        return _act(store, args)
    finally:
        store.close()


def _run_on_redis(args: argparse.Namespace) -> int:
    from serving.gateway.keys.redis_store import BlockingRedisKeyStore, KeyStoreUnavailable

    try:
        store = BlockingRedisKeyStore.from_url(args.redis_url)
    except ServingError as exc:  # a bad URL; the message does not quote it
        raise ServingError(f"--redis-url: {exc}") from None
    try:
        store.refresh()  # the keys as they are now: `list` and `show` read this snapshot
        return _act(store, args)
    except KeyStoreUnavailable as exc:
        raise ServingError(f"--redis-url: {exc}") from None
    finally:
        store.close()


def _act(store: WritableKeyStore, args: argparse.Namespace) -> int:
    if args.keys_command == "create":
        record, secret = store.create(_key_spec(args))
        print(f"created {record.key_id} ({record.name}) in {store.location}")
        print(f"secret: {secret}")
        print("the secret is shown only now: only its hash is stored")
    elif args.keys_command == "list":
        _print_table(store.list_keys())
    elif args.keys_command == "show":
        _check_key_id(args.key_id)
        _print_record(_existing(store.get(args.key_id), args.key_id, store.location))
    elif args.keys_command == "revoke":
        _check_key_id(args.key_id)
        record = store.revoke(args.key_id)
        print(f"revoked {record.key_id} ({record.name})")
    return 0


def _emit_yaml(args: argparse.Namespace) -> int:
    from serving.gateway.keys.file_store import render_keys_yaml
    from serving.gateway.keys.record import new_records

    record, secret = next(new_records(_key_spec(args)))
    # The YAML goes to stdout so it can be redirected into a file; the secret to the terminal.
    sys.stdout.write(render_keys_yaml([record]))
    print(f"created {record.key_id} ({record.name}); secret: {secret}", file=sys.stderr)
    print("the secret is shown only now: only its hash is in the YAML", file=sys.stderr)
    return 0


def _default_adapter(args: argparse.Namespace, models: tuple[str, ...]) -> str | None:
    from serving.gateway.keys.record import check_default_adapter

    return check_default_adapter(args.default_adapter, models, where="--default-adapter")


def _priority(args: argparse.Namespace) -> int:
    from serving.gateway.keys.record import check_priority

    return check_priority(args.priority, where="--priority")


def _weight(args: argparse.Namespace) -> int:
    from serving.gateway.keys.record import check_weight

    return check_weight(args.weight, where="--weight")


def _key_spec(args: argparse.Namespace) -> KeySpec:
    """Validated here so that errors name the flags, not the store's field names."""
    from serving.gateway.keys.record import KeySpec, check_model_limits, check_name

    name = check_name(args.name, where="--name")
    models = _models(args.models)
    model_limits = _model_limits(args.model_limit)
    check_model_limits(model_limits, models, where="--model-limit")
    return KeySpec(
        name,
        limits=_limits_from_flags(args),
        models=models,
        model_limits=model_limits,
        weight=_weight(args),
        default_adapter=_default_adapter(args, models),
        priority=_priority(args),
    )


def _limits_from_flags(args: argparse.Namespace) -> Limits:
    from serving.gateway.quota.limits import Limits

    values = {
        field: _non_negative(getattr(args, field), flag)
        for flag, field in LIMIT_FLAGS.items()
        if getattr(args, field) is not None
    }
    if values.get("max_tokens") == 0:
        raise ServingError("--max-tokens must be at least 1, got '0'")
    return Limits(**values)


def _model_limits(specs: list[str]) -> dict[str, Limits]:
    from serving.gateway.quota.limits import Limits

    parsed: dict[str, Limits] = {}
    for spec in specs:
        # rpartition: model names may contain ':' (qwen3:8b), limit lists never do.
        model, _, assignments = spec.rpartition(":")
        if not model or not assignments:
            raise ServingError(f"--model-limit {spec!r}: expected MODEL:NAME=N[,NAME=N...]")
        values: dict[str, object] = {}
        for assignment in assignments.split(","):
            name, equals, value = assignment.partition("=")
            name = name.strip().replace("-", "_")
            if not equals:
                raise ServingError(f"--model-limit {spec!r}: expected NAME=N, got {assignment!r}")
            values[name] = _non_negative(value.strip(), f"--model-limit {model}:{name}")
        parsed[model] = Limits.from_mapping(values, where=f"--model-limit {model}")
    return parsed


def _models(text: str) -> tuple[str, ...]:
    return tuple(model.strip() for model in text.split(",") if model.strip())


def _non_negative(text: str, flag: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise ServingError(f"{flag} must be a non-negative integer, got {text!r}")
    return value


def _check_key_id(key_id: str) -> None:
    from serving.gateway.keys.credentials import is_key_id

    if not is_key_id(key_id):
        raise ServingError(f"KEY_ID {key_id!r} is not a key id (expected e.g. key_ab12cd34)")


def _existing(record: KeyRecord | None, key_id: str, location: str) -> KeyRecord:
    if record is None:
        raise ServingError(f"KEY_ID {key_id!r}: no such key in {location}")
    return record


def _show(value: int | None) -> str:
    return "-" if value is None else str(value)


def _print_table(records: list[KeyRecord]) -> None:
    if not records:
        print("no keys")
        return
    header: tuple[str, ...] = ("ID", "NAME", "CREATED", "STATUS", "RPM", "TPM", "PER DAY")
    header += ("PER MONTH", "CONCURRENCY", "MAX TOKENS", "MODELS")
    rows: list[tuple[str, ...]] = [header]
    for record in records:
        limits = record.limits
        rows.append(
            (
                record.key_id,
                record.name,
                record.created_at.strftime("%Y-%m-%d %H:%M"),
                "revoked" if record.revoked else "active",
                _show(limits.rpm),
                _show(limits.tpm),
                _show(limits.tokens_per_day),
                _show(limits.tokens_per_month),
                _show(limits.max_concurrency),
                _show(limits.max_tokens),
                ",".join(record.models) or "all",
            )
        )
    widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
    for row in rows:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )


def _print_record(record: KeyRecord) -> None:
    from serving.gateway.keys.record import format_time

    lines = [
        ("id", record.key_id),
        ("name", record.name),
        ("created", format_time(record.created_at)),
        ("status", "revoked" if record.revoked else "active"),
        *((field, _show(getattr(record.limits, field))) for field in LIMIT_FLAGS.values()),
        ("models", ", ".join(record.models) or "all"),
        ("weight", str(record.weight)),
        ("default adapter", record.default_adapter or "-"),
        ("priority", str(record.priority)),
    ]
    for model, limits in record.model_limits.items():
        settings = ", ".join(f"{name}={value}" for name, value in limits.to_mapping().items())
        lines.append((f"limits for {model}", settings or "none"))
    width = max(len(label) for label, _ in lines) + 1
    for label, value in lines:
        print(f"{(label + ':').ljust(width)} {value}")
