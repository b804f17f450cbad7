"""Pure memory math for serving Qwen models on vLLM: weights, KV cache, activations, verdict.

    from serving.planner import PlanSettings, get_gpu, plan_for, resolve_model

    plan = plan_for(resolve_model("Qwen3-8B"), get_gpu("h100"), PlanSettings(max_model_len=32768))
    plan.fits, plan.capacity.tokens, plan.max_sequences

No torch, no vLLM: importing this package is instant.
"""

from serving.planner.catalog import CATALOG, resolve_model
from serving.planner.gpus import GPUS, GpuSpec, get_gpu
from serving.planner.models import GatedDeltaNetSpec, ModelSpec, MoeSpec
from serving.planner.plan import Plan, Problem, Suggestion, evaluate, plan_for
from serving.planner.render import plan_to_dict, render_table
from serving.planner.settings import PlanSettings

__all__ = [
    "CATALOG",
    "GPUS",
    "GatedDeltaNetSpec",
    "GpuSpec",
    "ModelSpec",
    "MoeSpec",
    "Plan",
    "PlanSettings",
    "Problem",
    "Suggestion",
    "evaluate",
    "get_gpu",
    "plan_for",
    "plan_to_dict",
    "render_table",
    "resolve_model",
]
