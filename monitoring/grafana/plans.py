"""The planner's prediction for every shipped profile, as PromQL constants for the dashboards.

    expr = planned("kv_capacity_tokens", running='serving_engine_startup_seconds{profile=~"$p"}')

`planned` yields one series per running profile, labelled `profile` and `model` (the served
model name, which is vLLM's `model_name` label and the launcher's `model` label): the planner's
number for that profile, kept only while the launcher of that profile exports `running`. The
numbers are computed when the dashboards are generated (`python -m monitoring.grafana`), so a
change to the planner or a profile shows up as a diff of the committed JSON.

Profiles of the project-built model (`builtin:`) are planned from the tiny model's build
parameters, not from a built checkpoint: generating needs no model on disk, and KV capacity
depends only on the architecture, the precision and the KV space.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from serving.planner.profile_plan import profile_plan
from serving.profiles import load_all_profiles
from serving.profiles.model import Profile

Field = Literal["kv_capacity_tokens", "kv_blocks", "max_sequences", "max_num_seqs"]


@dataclass(frozen=True)
class ProfilePlan:
    profile: str
    model: str  # served model name
    kv_capacity_tokens: int  # per replica: vLLM's "KV cache size: N tokens"
    kv_blocks: int  # per replica: vLLM's num_gpu_blocks
    max_sequences: int  # sequences of max_model_len that fit at once (capped by max_num_seqs)
    max_num_seqs: int


def plan_profile(profile: Profile) -> ProfilePlan:
    """What `serving plan --profile NAME` predicts, for the fields the dashboards chart."""
    plan = profile_plan(profile)
    return ProfilePlan(
        profile=profile.name,
        model=profile.served_model_name,
        kv_capacity_tokens=plan.capacity.tokens,
        kv_blocks=plan.capacity.num_blocks,
        max_sequences=plan.max_sequences,
        max_num_seqs=profile.max_num_seqs,
    )


def shipped_plans() -> list[ProfilePlan]:
    return [plan_profile(profile) for profile in load_all_profiles()]


def _constant(plan: ProfilePlan, field: Field) -> str:
    value = getattr(plan, field)
    inner = f'label_replace(vector({value}), "profile", "{plan.profile}", "", "")'
    return f'label_replace({inner}, "model", "{plan.model}", "", "")'


def planned(field: Field, *, running: str, plans: list[ProfilePlan] | None = None) -> str:
    """PromQL: the planner's `field` for each profile whose launcher exports `running`."""
    chosen = shipped_plans() if plans is None else plans
    constants = "\n  or ".join(_constant(plan, field) for plan in chosen)
    return f"(\n  {constants}\n)\nand on (profile, model) {running}"
