"""A key record and its declarative form (the mapping used in key files and the database).

The declarative form, one entry of a keys file:

    id: key_ab12cd34
    name: team-a
    created_at: "2025-03-01T12:00:00Z"
    secret_sha256: 3f0c...            # sha256 hex of the secret; the secret is not stored
    revoked: false
    limits: {rpm: 60, tpm: 20000, tokens_per_day: 1000000, max_concurrency: 4, max_tokens: 2048}
    models: [qwen3-tiny]              # empty or absent: every model
    model_limits:                     # optional, counted separately and on top of `limits`
      qwen3-tiny: {rpm: 10}
    weight: 2                         # optional (default 1): share of the engine under fair
                                      # sharing, against the other keys waiting
    default_adapter: team-a-lora      # optional: a request naming a base model is served by
                                      # this LoRA adapter instead (in `models`, when set)
    priority: -1                      # optional (default 0): vLLM's priority for its requests,
                                      # lower first (with --engine-priority)

`new_records` is how every writer makes a new key from a `KeySpec` (what was asked for): the
fields checked once, an id and secret drawn, the secret hashed.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from serving.errors import ServingError
from serving.gateway.keys.credentials import hash_secret, is_key_id, new_secret
from serving.gateway.quota.limits import Limits

NO_LIMITS = Limits()
MAX_NAME_LENGTH = 200
# Ids have 8 hex digits: a collision is rare, this many in a row practically never.
ID_ATTEMPTS = 5
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
_FIELDS = {
    "id",
    "name",
    "created_at",
    "secret_sha256",
    "revoked",
    "limits",
    "models",
    "model_limits",
    "weight",
    "default_adapter",
    "priority",
}
MAX_WEIGHT = 1000
MAX_PRIORITY = 100  # priority classes run from -MAX_PRIORITY (first) to MAX_PRIORITY


@dataclass(frozen=True, slots=True)
class KeySpec:
    """A new key as asked for, not yet checked: what every store's `create` and
    `new_records` take, so the fields are listed once.

    Usage: `store.create(KeySpec("team-a", limits=Limits(rpm=60), models=["qwen3-tiny"]))`.
    """

    name: str
    limits: Limits = NO_LIMITS
    models: Sequence[str] = ()  # empty: every model
    model_limits: Mapping[str, Limits] | None = None
    weight: int = 1
    default_adapter: str | None = None
    priority: int = 0


@dataclass(frozen=True, slots=True)
class KeyRecord:
    key_id: str
    name: str
    secret_sha256: str
    created_at: datetime
    limits: Limits = NO_LIMITS
    models: tuple[str, ...] = ()  # empty: every model
    model_limits: Mapping[str, Limits] = field(default_factory=dict)
    revoked: bool = False
    weight: int = 1
    default_adapter: str | None = None
    """Requests that name a base model are sent to this adapter instead (`served_model`)."""
    priority: int = 0
    """vLLM's `priority` for the key's requests (lower is scheduled first), sent when the
    gateway runs with engine_priority."""

    def allows_model(self, model: str) -> bool:
        return not self.models or model in self.models

    def to_document(self) -> dict[str, Any]:
        document: dict[str, Any] = {
            "id": self.key_id,
            "name": self.name,
            "created_at": format_time(self.created_at),
            "secret_sha256": self.secret_sha256,
            "revoked": self.revoked,
            "limits": self.limits.to_mapping(),
            "models": list(self.models),
        }
        if self.model_limits:
            document["model_limits"] = {
                model: limits.to_mapping() for model, limits in self.model_limits.items()
            }
        if self.weight != 1:
            document["weight"] = self.weight
        if self.default_adapter is not None:
            document["default_adapter"] = self.default_adapter
        if self.priority:
            document["priority"] = self.priority
        return document

    @classmethod
    def from_document(cls, data: object, *, where: str) -> KeyRecord:
        """Parse and validate one entry; errors name the entry and the field."""
        if not isinstance(data, Mapping):
            raise ServingError(f"{where}: a key entry must be a mapping, got {data!r}")
        unknown = sorted(set(data) - _FIELDS)
        if unknown:
            raise ServingError(f"{where}: unknown field {unknown[0]!r}")
        key_id = data.get("id")
        if not isinstance(key_id, str) or not is_key_id(key_id):
            raise ServingError(f"{where}.id must look like key_ab12cd34, got {key_id!r}")
        where = f"{where} ({key_id})"
        secret_sha256 = data.get("secret_sha256")
        if not isinstance(secret_sha256, str) or not _SHA256_HEX.fullmatch(secret_sha256):
            raise ServingError(f"{where}.secret_sha256 must be 64 lowercase hex digits")
        revoked = data.get("revoked", False)
        if not isinstance(revoked, bool):
            raise ServingError(f"{where}.revoked must be true or false, got {revoked!r}")
        models = check_models(data.get("models") or [], where=f"{where}.models")
        model_limits = _model_limits(_mapping(data, "model_limits", where), where)
        check_model_limits(model_limits, models, where=f"{where}.model_limits")
        default_adapter = check_default_adapter(
            data.get("default_adapter"), models, where=f"{where}.default_adapter"
        )
        return cls(
            key_id=key_id,
            name=check_name(data.get("name"), where=f"{where}.name"),
            secret_sha256=secret_sha256,
            created_at=parse_time(data.get("created_at"), where=f"{where}.created_at"),
            limits=Limits.from_mapping(_mapping(data, "limits", where), where=f"{where}.limits"),
            models=models,
            model_limits=model_limits,
            revoked=revoked,
            weight=check_weight(data.get("weight", 1), where=f"{where}.weight"),
            default_adapter=default_adapter,
            priority=check_priority(data.get("priority", 0), where=f"{where}.priority"),
        )


def check_priority(value: object, *, where: str) -> int:
    """A key's priority class: an integer from -MAX_PRIORITY to MAX_PRIORITY."""
    if isinstance(value, bool) or not isinstance(value, int) or abs(value) > MAX_PRIORITY:
        raise ServingError(
            f"{where} must be an integer from -{MAX_PRIORITY} to {MAX_PRIORITY}, got {value!r}"
        )
    return value


def check_weight(value: object, *, where: str) -> int:
    """A key's fair-sharing weight: an integer from 1 to MAX_WEIGHT."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_WEIGHT:
        raise ServingError(f"{where} must be an integer from 1 to {MAX_WEIGHT}, got {value!r}")
    return value


def check_default_adapter(value: object, models: tuple[str, ...], *, where: str) -> str | None:
    """A default adapter the key may use (one outside `models` would send every request to
    a model the key is refused)."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ServingError(f"{where} must be an adapter name, got {value!r}")
    if models and value not in models:
        raise ServingError(f"{where}: {value!r} is not in the key's models {models}")
    return value


def new_records(spec: KeySpec, *, now: datetime | None = None) -> Iterator[tuple[KeyRecord, str]]:
    """Up to `ID_ATTEMPTS` candidates `(record, secret)` for one new key, each with a freshly
    drawn id: a store keeps the first whose id is free. The fields are checked before the
    first is drawn; errors name them (`name`, `models`, `model_limits`, ...)."""
    checked_name = check_name(spec.name, where="name")
    checked_models = check_models(list(spec.models), where="models")
    checked_model_limits = dict(spec.model_limits or {})
    check_model_limits(checked_model_limits, checked_models, where="model_limits")
    checked_weight = check_weight(spec.weight, where="weight")
    checked_adapter = check_default_adapter(
        spec.default_adapter, checked_models, where="default_adapter"
    )
    checked_priority = check_priority(spec.priority, where="priority")
    created_at = (now or datetime.now(UTC)).replace(microsecond=0)
    for _ in range(ID_ATTEMPTS):
        key_id, secret = new_secret()
        record = KeyRecord(
            key_id=key_id,
            name=checked_name,
            secret_sha256=hash_secret(secret),
            created_at=created_at,
            limits=spec.limits,
            models=checked_models,
            model_limits=checked_model_limits,
            weight=checked_weight,
            default_adapter=checked_adapter,
            priority=checked_priority,
        )
        yield record, secret


def check_name(value: object, *, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ServingError(f"{where} must be a non-empty string, got {value!r}")
    if len(value) > MAX_NAME_LENGTH or not value.isprintable():
        raise ServingError(f"{where} must be printable and at most {MAX_NAME_LENGTH} characters")
    return value


def check_models(value: object, *, where: str) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or not all(
        isinstance(model, str) and model.strip() for model in value
    ):
        raise ServingError(f"{where} must be a list of model names, got {value!r}")
    return tuple(value)


def check_model_limits(
    model_limits: Mapping[str, Limits], models: tuple[str, ...], *, where: str
) -> None:
    """An override for a model the key may not use would silently never apply."""
    for model in model_limits:
        if models and model not in models:
            raise ServingError(f"{where}: model {model!r} is not in the key's models {models}")


def format_time(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: object, *, where: str) -> datetime:
    # YAML turns an unquoted timestamp into a datetime itself; accept that as well.
    if isinstance(value, datetime):
        parsed = value
    elif isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            raise ServingError(f"{where} must be an ISO 8601 time, got {value!r}") from None
    else:
        raise ServingError(f"{where} must be an ISO 8601 time, got {value!r}")
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _mapping(data: Mapping[Any, Any], name: str, where: str) -> Mapping[str, object]:
    value = data.get(name) or {}
    if not isinstance(value, Mapping):
        raise ServingError(f"{where}.{name} must be a mapping, got {value!r}")
    return value


def _model_limits(data: Mapping[str, object], where: str) -> dict[str, Limits]:
    parsed: dict[str, Limits] = {}
    for model, limits in data.items():
        if not isinstance(limits, Mapping):
            raise ServingError(f"{where}.model_limits.{model} must be a mapping")
        parsed[str(model)] = Limits.from_mapping(limits, where=f"{where}.model_limits.{model}")
    return parsed
