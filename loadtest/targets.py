"""Targets per profile (loadtest/targets/<profile>.yaml) and the verdict of a run against them.

Every target is optional; a target that is set but cannot be measured (no engine metrics
scraped, no successful request) is a miss, not a pass: an operator must not read "ok" for
a check that never ran.

Usage: `verdict = evaluate(load_targets("cpu-tiny"), measured)`; `verdict.passed`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from loadtest.errors import LoadTestError

TARGETS_DIR = Path(__file__).parent / "targets"


class Targets(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    profile: str = ""
    description: str = ""
    min_output_tokens_per_s: float | None = Field(default=None, ge=0)
    max_ttft_p50_ms: float | None = Field(default=None, gt=0)
    max_ttft_p99_ms: float | None = Field(default=None, gt=0)
    max_itl_p50_ms: float | None = Field(default=None, gt=0)
    max_itl_p99_ms: float | None = Field(default=None, gt=0)
    max_kv_cache_usage: float | None = Field(default=None, ge=0, le=1)
    max_preemptions: int | None = Field(default=None, ge=0)
    max_error_rate: float | None = Field(default=None, ge=0, le=1)

    def latency_only(self) -> Targets:
        """The targets a concurrency level must meet to count as goodput (no throughput floor)."""
        return self.model_copy(update={"min_output_tokens_per_s": None})


def load_targets(name_or_path: str) -> Targets:
    """Targets by profile name (`cpu-tiny`) or from a YAML file by path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = TARGETS_DIR / f"{name_or_path}.yaml"
        if not path.exists():
            known = ", ".join(sorted(p.stem for p in TARGETS_DIR.glob("*.yaml")))
            raise LoadTestError(f"no targets for profile {name_or_path!r} (have: {known})")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        return Targets.model_validate(data)
    except (OSError, yaml.YAMLError) as exc:
        raise LoadTestError(f"{path}: {exc}") from exc
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        raise LoadTestError(f"{path}: field '{where}': {error['msg']}") from exc


@dataclass(frozen=True)
class Measured:
    """What a run measured; None where it could not be measured."""

    output_tokens_per_s: float | None
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    itl_p50_ms: float | None
    itl_p99_ms: float | None
    kv_cache_usage_max: float | None
    preemptions: float | None
    error_rate: float | None


@dataclass(frozen=True)
class Check:
    name: str
    target: str
    measured: str
    passed: bool


@dataclass(frozen=True)
class Verdict:
    checks: list[Check]

    @property
    def passed(self) -> bool:
        return all(check.passed for check in self.checks)

    def table(self) -> str:
        rows = [("check", "target", "measured", "result")]
        rows += [(c.name, c.target, c.measured, "ok" if c.passed else "MISS") for c in self.checks]
        widths = [max(len(row[i]) for row in rows) for i in range(4)]
        lines = [
            "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows
        ]
        lines.insert(1, "  ".join("-" * w for w in widths))
        overall = "PASS" if self.passed else "FAIL"
        return "\n".join([*lines, f"verdict: {overall}"])


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "no data"
    if unit == "%":
        return f"{value * 100:.1f}%"
    return f"{value:,.0f}{unit}" if abs(value) >= 1000 else f"{value:.4g}{unit}"


# (check name, target field, measured field, unit, True when the target is a floor)
RULES: list[tuple[str, str, str, str, bool]] = [
    ("output tokens/s", "min_output_tokens_per_s", "output_tokens_per_s", " tok/s", True),
    ("TTFT p50", "max_ttft_p50_ms", "ttft_p50_ms", " ms", False),
    ("TTFT p99", "max_ttft_p99_ms", "ttft_p99_ms", " ms", False),
    ("ITL p50", "max_itl_p50_ms", "itl_p50_ms", " ms", False),
    ("ITL p99", "max_itl_p99_ms", "itl_p99_ms", " ms", False),
    ("KV cache usage (max)", "max_kv_cache_usage", "kv_cache_usage_max", "%", False),
    ("preemptions", "max_preemptions", "preemptions", "", False),
    ("error rate", "max_error_rate", "error_rate", "%", False),
]


def evaluate(targets: Targets, measured: Measured) -> Verdict:
    checks: list[Check] = []
    for name, target_field, measured_field, unit, floor in RULES:
        limit: float | None = getattr(targets, target_field)
        if limit is None:
            continue
        value: float | None = getattr(measured, measured_field)
        compare: Callable[[float, float], bool] = (
            (lambda v, t: v >= t) if floor else (lambda v, t: v <= t)
        )
        passed = value is not None and compare(value, limit)
        sign = ">=" if floor else "<="
        checks.append(Check(name, f"{sign} {_fmt(limit, unit)}", _fmt(value, unit), passed))
    return Verdict(checks)
