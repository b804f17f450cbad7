"""Read what vLLM itself reports about its KV cache, to hold the planner against it."""

from __future__ import annotations

import re
import urllib.request

from serving.planner import get_gpu, plan_for, resolve_model
from serving.planner.kv import KvCapacity
from serving.planner.profile_plan import profile_settings
from serving.profiles import load_profile

CACHE_INFO = re.compile(r"^vllm:cache_config_info\{([^}]*)\}", re.MULTILINE)
LABEL = re.compile(r'(\w+)="([^"]*)"')


def vllm_cache_info(engine_url: str) -> dict[str, str]:
    with urllib.request.urlopen(f"{engine_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    match = CACHE_INFO.search(text)
    assert match, "vllm:cache_config_info missing from vLLM's /metrics"
    return dict(LABEL.findall(match.group(1)))


def planned_capacity(profile_name: str, model_dir: str) -> KvCapacity:
    profile = load_profile(profile_name)
    plan = plan_for(resolve_model(model_dir), get_gpu("cpu"), profile_settings(profile))
    return plan.capacity
