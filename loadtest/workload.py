"""Workloads are data: YAML files under loadtest/workloads/ describing the requests to send.

A workload is a weighted mix of scenarios. Each scenario gives prompt and output lengths in
the model's own tokens, fixed (`64`), ranged (`[32, 128]`, uniform) or, for prompts, relative
to the profile's context (`"90%"` of max_model_len, output tokens subtracted); `ignore_eos`
for exact output lengths; and an optional shared prefix (`shared_prefix_tokens` taken from
`prefixes` distinct texts) to exercise prefix caching. Generation is seeded (`seed`).

Tenants. A scenario may name a `tenant` (its requests then carry that tenant's key, from
LOADTEST_API_KEY_<TENANT>, e.g. LOADTEST_API_KEY_NOISY; no tenant: the run's own key), and a
tenant's scenarios may send in `bursts: [on_s, off_s]` (its users send only during the first
on_s seconds of every on_s + off_s). Users are split between tenants by the weight of their
scenarios; `two-tenant` is a quiet tenant beside a bursty one, to try fair sharing with.

Usage: `workload = load_workload("short-chat"); lo, hi = workload.scenarios[0].prompt_range(2048)`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from loadtest.config import Tenancy
from loadtest.errors import LoadTestError

WORKLOADS_DIR = Path(__file__).parent / "workloads"

# 64, [32, 128], "90%" or ["75%", "90%"]
LengthSpec = int | str | list[int | str]


def _bound(value: int | str, context: int, field_name: str) -> int:
    if isinstance(value, int):
        return value
    text = value.strip()
    if not text.endswith("%"):
        raise LoadTestError(f"{field_name}={value!r}: expected an integer or a percentage")
    try:
        percent = float(text[:-1])
    except ValueError as exc:
        raise LoadTestError(f"{field_name}={value!r}: not a percentage") from exc
    return int(context * percent / 100)


def length_range(spec: LengthSpec, context: int, field_name: str) -> tuple[int, int]:
    """(low, high) inclusive, in tokens, for a length spec against a context of `context`."""
    bounds = spec if isinstance(spec, list) else [spec, spec]
    if len(bounds) != 2:
        raise LoadTestError(f"{field_name}={spec!r}: a range is [low, high]")
    low, high = (_bound(b, context, field_name) for b in bounds)
    if not 1 <= low <= high:
        raise LoadTestError(f"{field_name}={spec!r}: need 1 <= low <= high, got {low}..{high}")
    return low, high


class Scenario(BaseModel):
    """One kind of request in a workload."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    weight: float = Field(default=1.0, gt=0)
    prompt_tokens: LengthSpec
    output_tokens: int | list[int]
    ignore_eos: bool = True
    shared_prefix_tokens: int = Field(default=0, ge=0)
    prefixes: int = Field(default=1, ge=1)
    temperature: float = Field(default=0.0, ge=0)
    tenant: str = Field(default="", pattern=r"^([a-z0-9][a-z0-9-]*)?$")
    bursts: tuple[float, float] | None = None

    @model_validator(mode="after")
    def _positive_bursts(self) -> Scenario:
        if self.bursts is not None and (self.bursts[0] <= 0 or self.bursts[1] < 0):
            raise ValueError(f"bursts {list(self.bursts)}: need on_s > 0 and off_s >= 0")
        return self

    def output_range(self) -> tuple[int, int]:
        return length_range(
            list(self.output_tokens)
            if isinstance(self.output_tokens, list)
            else self.output_tokens,
            1 << 30,
            f"{self.name}.output_tokens",
        )

    def prompt_range(self, max_model_len: int) -> tuple[int, int]:
        """Prompt lengths that fit the context with the longest output of this scenario."""
        out_high = self.output_range()[1]
        low, high = length_range(self.prompt_tokens, max_model_len, f"{self.name}.prompt_tokens")
        if isinstance(self.prompt_tokens, str) or (
            isinstance(self.prompt_tokens, list)
            and any(isinstance(b, str) for b in self.prompt_tokens)
        ):
            low, high = min(low, max_model_len - out_high), min(high, max_model_len - out_high)
        if high + out_high > max_model_len:
            raise LoadTestError(
                f"{self.name}: prompt_tokens up to {high} + output_tokens {out_high} exceed "
                f"max_model_len {max_model_len}"
            )
        if self.shared_prefix_tokens >= low:
            raise LoadTestError(
                f"{self.name}: shared_prefix_tokens={self.shared_prefix_tokens} must be less "
                f"than the shortest prompt ({low} tokens)"
            )
        return low, high


class Workload(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    description: str = ""
    seed: int = 0
    num_prompts: int = Field(default=200, ge=1)
    scenarios: list[Scenario] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_names(self) -> Workload:
        names = [s.name for s in self.scenarios]
        if len(set(names)) != len(names):
            raise ValueError(f"scenario names must be unique, got {names}")
        for tenant in {s.tenant for s in self.scenarios}:
            bursts = {s.bursts for s in self.scenarios if s.tenant == tenant}
            if len(bursts) > 1:
                raise ValueError(f"tenant {tenant!r}: its scenarios must share one bursts")
        return self

    def tenants(self) -> dict[str, Tenancy]:
        """Per tenant ("" for the run's own key): its scenarios, its share of the users (the
        weight of its scenarios) and its bursts."""
        total = sum(s.weight for s in self.scenarios)
        found: dict[str, Tenancy] = {}
        for scenario in self.scenarios:
            known = found.get(scenario.tenant)
            found[scenario.tenant] = Tenancy(
                scenarios=(*(known.scenarios if known else ()), scenario.name),
                share=(known.share if known else 0.0) + scenario.weight / total,
                bursts=scenario.bursts,
            )
        return found


def builtin_workload_names() -> list[str]:
    return sorted(p.stem for p in WORKLOADS_DIR.glob("*.yaml"))


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"]) or "(top level)"
    return f"field '{where}': {error['msg']}"


def parse_workload(data: Any, *, source: str, default_name: str) -> Workload:
    if not isinstance(data, dict):
        raise LoadTestError(f"{source}: expected a mapping at the top level")
    try:
        return Workload.model_validate({"name": default_name, **data})
    except ValidationError as exc:
        raise LoadTestError(f"{source}: {_first_error(exc)}") from exc


def load_workload(name_or_path: str) -> Workload:
    """A built-in workload by name (`short-chat`) or a YAML file by path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = WORKLOADS_DIR / f"{name_or_path}.yaml"
        if not path.exists():
            known = ", ".join(builtin_workload_names())
            raise LoadTestError(f"unknown workload {name_or_path!r} (built in: {known})")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise LoadTestError(f"{path}: {exc}") from exc
    return parse_workload(data, source=str(path), default_name=path.stem)
