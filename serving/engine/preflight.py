"""Plan a profile's memory before starting vLLM, and refuse one that cannot fit.

Starting a 7B engine only to have it die of OOM minutes later is the failure users came to us
to avoid: the planner answers in milliseconds, so it runs first.
"""

from __future__ import annotations

from collections.abc import Callable

from serving.errors import ServingError
from serving.planner import Plan, get_gpu, plan_for, resolve_model
from serving.planner.command import profile_settings
from serving.profiles.model import Profile


def plan_profile(profile: Profile, model_path: str) -> Plan | None:
    """The memory plan for `profile`, or None when the planner knows nothing of the model."""
    try:
        spec = resolve_model(model_path)
    except ServingError:
        return None
    gpu = get_gpu("cpu" if profile.device == "cpu" else (profile.gpu or ""))
    return plan_for(spec, gpu, profile_settings(profile))


def preflight(
    profile: Profile, model_path: str, warn: Callable[[str], None] = print
) -> Plan | None:
    """Raise a one-line ServingError naming why `profile` cannot fit; None if not plannable."""
    plan = plan_profile(profile, model_path)
    if plan is None:
        warn(f"planner: no spec for {profile.model}; memory not checked before start")
        return None
    for warning in plan.warnings:
        warn(f"planner: warning: {warning}")
    if plan.fits:
        return plan
    reasons = "; ".join(problem.message for problem in plan.problems) or str(plan.binding)
    fix = f"; cheapest fix: {plan.suggestion.change}" if plan.suggestion else ""
    raise ServingError(f"profile {profile.name} does not fit: {reasons}{fix}")
