"""A minimal key for quota tests: the engine only reads id and limits."""

from __future__ import annotations

import calendar
from collections.abc import Mapping
from dataclasses import dataclass, field

from serving.gateway.quota import Limits

NO_LIMITS = Limits()


@dataclass(frozen=True)
class Subject:
    key_id: str
    limits: Limits = NO_LIMITS
    model_limits: Mapping[str, Limits] = field(default_factory=dict)


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> float:
    return float(calendar.timegm((year, month, day, hour, minute, second)))
