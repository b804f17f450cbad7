"""The rule files prometheus.yml loads, read into plain values.

    for rule in load_rules(): rule.kind ("record" | "alert"), rule.name, rule.expr,
                              rule.labels, rule.annotations, rule.group, rule.file
    rule_files()              # the paths, in prometheus.yml's order

For tests and tools that need to know which rules exist (a promtool case for each, each
recording rule queried in a live Prometheus); promtool itself checks that they are valid.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from monitoring.prometheus import CONFIG


@dataclass(frozen=True)
class Rule:
    kind: Literal["record", "alert"]
    name: str
    expr: str
    group: str
    file: Path
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    for_: str = ""

    @property
    def selector(self) -> str:
        """The series a recording rule writes, as a PromQL selector (its static labels)."""
        matchers = ",".join(f'{k}="{v}"' for k, v in sorted(self.labels.items()))
        return f"{self.name}{{{matchers}}}" if matchers else self.name


def rule_files(config: Path = CONFIG) -> list[Path]:
    """The rule files `config` loads, resolved against its directory like Prometheus does."""
    data: dict[str, Any] = yaml.safe_load(config.read_text(encoding="utf-8"))
    return [config.parent / str(name) for name in data.get("rule_files", [])]


def load_rules(config: Path = CONFIG) -> list[Rule]:
    rules: list[Rule] = []
    for path in rule_files(config):
        data: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        for group in data.get("groups", []):
            for item in group.get("rules", []):
                kind: Literal["record", "alert"] = "record" if "record" in item else "alert"
                rules.append(
                    Rule(
                        kind=kind,
                        name=str(item[kind]),
                        expr=str(item["expr"]),
                        group=str(group["name"]),
                        file=path,
                        labels={str(k): str(v) for k, v in (item.get("labels") or {}).items()},
                        annotations={
                            str(k): str(v) for k, v in (item.get("annotations") or {}).items()
                        },
                        for_=str(item.get("for", "")),
                    )
                )
    return rules
