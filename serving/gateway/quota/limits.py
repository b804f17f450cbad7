"""What a key may use: limit values and the scopes they apply to.

A key has one `Limits` for all of its traffic and optionally a stricter `Limits` per model;
both apply to a request for that model (the per-model counters are separate from the key's).
`None` means "no limit" for that dimension.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import NamedTuple, Protocol

from serving.errors import ServingError


@dataclass(frozen=True, slots=True)
class Limits:
    """Limit values of one scope; usage: `Limits(rpm=60, tpm=20_000, max_tokens=1024)`."""

    rpm: int | None = None
    tpm: int | None = None
    tokens_per_day: int | None = None
    tokens_per_month: int | None = None
    max_concurrency: int | None = None
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if value is None:
                continue
            # bool is an int subclass; `rpm: true` in a keys file is a mistake, not 1.
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ServingError(f"{item.name} must be a non-negative integer, got {value!r}")
        if self.max_tokens == 0:
            raise ServingError("max_tokens must be at least 1, got 0")

    @classmethod
    def from_mapping(cls, data: Mapping[str, object], *, where: str = "limits") -> Limits:
        """Build from a parsed YAML/JSON mapping; unknown names are errors, not ignored."""
        known = {item.name for item in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ServingError(f"{where}: unknown limit {unknown[0]!r} (known: {sorted(known)})")
        values: dict[str, int | None] = {}
        for name, value in data.items():
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ServingError(f"{where}.{name} must be an integer or null, got {value!r}")
            values[name] = value
        try:
            return cls(**values)
        except ServingError as exc:
            raise ServingError(f"{where}.{exc}") from None

    def to_mapping(self) -> dict[str, int]:
        """The set limits only, for files and the database (unset ones are omitted)."""
        return {
            item.name: getattr(self, item.name)
            for item in fields(self)
            if getattr(self, item.name) is not None
        }


class Scope(NamedTuple):
    """What a counter belongs to: a key, or a key for one model (`model` set)."""

    key_id: str
    model: str | None = None


class ScopedLimits(NamedTuple):
    scope: Scope
    limits: Limits


class QuotaSubject(Protocol):
    """The part of a key record the quota engine reads (keys.KeyRecord satisfies it)."""

    @property
    def key_id(self) -> str: ...

    @property
    def limits(self) -> Limits: ...

    @property
    def model_limits(self) -> Mapping[str, Limits]: ...


def scoped_limits(subject: QuotaSubject, model: str) -> tuple[ScopedLimits, ...]:
    """The key-wide scope first, then the key+model scope when the key overrides that model."""
    key_scope = ScopedLimits(Scope(subject.key_id), subject.limits)
    per_model = subject.model_limits.get(model)
    if per_model is None:
        return (key_scope,)
    return key_scope, ScopedLimits(Scope(subject.key_id, model), per_model)
