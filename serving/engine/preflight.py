"""Check a profile against this host and plan its memory before starting vLLM.

Starting a 7B engine only to have it die minutes later (no GPUs, weights that cannot be
downloaded, OOM) is the failure users came to us to avoid. Each check here answers in
milliseconds from local facts, with no network and no GPU library, and runs in the order a
user on the wrong machine needs to hear them: GPUs, then weights, then memory.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path

from serving.engine.hf_cache import (
    cached_checkpoint,
    hub_cache_dir,
    hub_offline,
    is_hub_name,
    repo_cache_dir,
)
from serving.engine.visible_gpus import OVERRIDE_ENV, VisibleGpus, visible_gpus
from serving.errors import ServingError
from serving.planner import Plan, get_gpu, plan_for, resolve_model
from serving.planner.profile_plan import profile_settings
from serving.profiles.model import Profile
from serving.vllm_flags import engine_env

Warn = Callable[[str], None]
GpuCounter = Callable[[Mapping[str, str]], VisibleGpus]


def process_env(profile: Profile) -> dict[str, str]:
    """The environment vLLM will run in (what `flags.render` adds to this process's): a
    profile's `env` may set CUDA_VISIBLE_DEVICES or HF_HUB_OFFLINE, and those are what vLLM
    obeys."""
    return {**os.environ, **engine_env(profile)}


def check_gpus(profile: Profile, env: Mapping[str, str], gpus: GpuCounter = visible_gpus) -> None:
    """Raise if vLLM would see fewer GPUs than the profile's tensor-parallel ranks."""
    if profile.device != "gpu":
        return
    # vLLM puts one tensor-parallel rank on each GPU; gpu_count beyond that describes the
    # machine (replicas) and is not needed to start this one engine.
    wanted = profile.tensor_parallel_size
    found = gpus(env)
    if found.count >= wanted:
        return
    raise ServingError(
        f"profile {profile.name} wants {wanted} GPU{'s' if wanted > 1 else ''} "
        f"(tensor_parallel_size {wanted}) but {found.count} "
        f"{'is' if found.count == 1 else 'are'} visible ({found.source}); "
        f"set {OVERRIDE_ENV}=N if that count is wrong"
    )


def check_weights(model_path: str, env: Mapping[str, str], warn: Warn = print) -> None:
    """Raise if a hub checkpoint is not cached and the hub is off; note it if merely uncached."""
    if Path(model_path).expanduser().exists() or not is_hub_name(model_path):
        return
    cache = hub_cache_dir(env)
    if cached_checkpoint(model_path, cache) is not None:
        return
    where = repo_cache_dir(model_path, cache)
    if hub_offline(env):
        raise ServingError(
            f"weights for {model_path} are not in the local Hugging Face cache (looked in "
            f"{where}) and HF_HUB_OFFLINE is set; download them with `hf download "
            f"{model_path}` or point the profile's model at a local directory"
        )
    # No network call here: asking the hub could itself hang for the timeout this avoids.
    warn(f"preflight: {model_path} is not in the local cache ({where}); vLLM will download it")


def check_adapters(
    profile: Profile, adapters: Mapping[str, str], env: Mapping[str, str], warn: Warn = print
) -> None:
    """Raise if an adapter's files contradict its profile entry (a rank vLLM would refuse
    minutes later) or a hub adapter is not cached while the hub is off."""
    for adapter in profile.lora.adapters if profile.lora else ():
        path = adapters.get(adapter.name, adapter.path)
        config = Path(path).expanduser() / "adapter_config.json"
        if not config.is_file():
            check_weights(path, env, warn)
            continue
        try:
            rank = json.loads(config.read_text(encoding="utf-8")).get("r")
        except (OSError, ValueError, AttributeError) as exc:
            raise ServingError(f"adapter {adapter.name}: cannot read {config} ({exc})") from None
        if rank != adapter.rank:
            raise ServingError(
                f"profile {profile.name}: adapter {adapter.name}: {config} says r={rank}, "
                f"the profile says rank {adapter.rank}"
            )


def plan_profile(profile: Profile, model_path: str) -> Plan | None:
    """The memory plan for `profile`, or None when the planner knows nothing of the model."""
    try:
        spec = resolve_model(model_path)
    except ServingError:
        return None
    gpu = get_gpu("cpu" if profile.device == "cpu" else (profile.gpu or ""))
    return plan_for(spec, gpu, profile_settings(profile))


def preflight(
    profile: Profile,
    model_path: str,
    warn: Warn = print,
    *,
    env: Mapping[str, str] | None = None,
    gpus: GpuCounter = visible_gpus,
    adapters: Mapping[str, str] | None = None,
) -> Plan | None:
    """Raise a one-line ServingError naming why `profile` cannot start here; None if the
    memory is not plannable. `env` defaults to the engine's; `gpus` counts visible GPUs;
    `adapters` are the LoRA adapters' resolved paths (engine.resolve.resolve_adapters)."""
    env = process_env(profile) if env is None else env
    check_gpus(profile, env, gpus)
    check_weights(model_path, env, warn)
    check_adapters(profile, adapters or {}, env, warn)
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
