"""What every command needs before it sends a request: profile, model name, tokenizer, prompts.

Usage: `plan = make_plan(workload="short-chat", profile="cpu-tiny", out=dir)`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from loadtest.errors import LoadTestError
from loadtest.prompts import generate_prompts, load_tokenizer, write_prompts
from loadtest.targets import Targets, load_targets
from loadtest.workload import Workload, load_workload
from serving.profiles import load_profile


@dataclass(frozen=True)
class Plan:
    workload: Workload
    model: str
    max_model_len: int
    tokenizer: str
    prompts_path: Path
    targets: Targets
    targets_source: str


def parse_duration(text: str) -> float:
    """`90`, `90s`, `2m`, `1h30m` -> seconds."""
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    parts = re.findall(r"(\d+(?:\.\d+)?)([hms])", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise LoadTestError(f"duration {text!r}: expected e.g. 30s, 2m, 1h30m")
    scale = {"h": 3600.0, "m": 60.0, "s": 1.0}
    return sum(float(n) * scale[u] for n, u in parts)


def resolve_tokenizer(profile_name: str, explicit: str | None) -> str:
    if explicit:
        return explicit
    from serving.engine.resolve import resolve_model

    profile = load_profile(profile_name)
    return profile.tokenizer or resolve_model(profile)


def make_plan(
    *,
    workload: str,
    profile: str,
    out: Path,
    tokenizer: str | None = None,
    model: str | None = None,
    targets: str | None = None,
    no_targets: bool = False,
) -> Plan:
    """`no_targets`: the run is judged by something else (the memory plan), not by targets."""
    loaded_profile = load_profile(profile)
    loaded_workload = load_workload(workload)
    source = resolve_tokenizer(profile, tokenizer)
    prompts = generate_prompts(
        loaded_workload, load_tokenizer(source), max_model_len=loaded_profile.max_model_len
    )
    out.mkdir(parents=True, exist_ok=True)
    prompts_path = out / "prompts.jsonl"
    write_prompts(prompts, prompts_path)
    targets_source = "none" if no_targets else targets or profile
    return Plan(
        workload=loaded_workload,
        model=model or loaded_profile.served_model_name,
        max_model_len=loaded_profile.max_model_len,
        tokenizer=source,
        prompts_path=prompts_path,
        targets=Targets() if no_targets else load_targets(targets_source),
        targets_source=targets_source,
    )
