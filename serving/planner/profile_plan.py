"""A profile's plan: the planner's inputs (model, GPU, settings) read from a `Profile`.

    plan = profile_plan(load_profile("cpu-tiny"))     # what `serving plan --profile` predicts
    settings = profile_settings(profile)              # every engine setting, as PlanSettings

The engine's preflight, the Kubernetes sizing and `serving plan` all plan a profile this way.
A project-built model (`builtin:NAME`) is planned from its build parameters, so planning needs
no checkpoint; `Profile` is only an annotation here, so importing this needs no pydantic.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from serving.errors import ServingError
from serving.paths import BUILTIN_PREFIX, models_dir
from serving.planner.catalog import names_awq, resolve_model
from serving.planner.gpus import GpuSpec, get_gpu
from serving.planner.models import ModelSpec
from serving.planner.plan import Plan, plan_for
from serving.planner.settings import PlanSettings

if TYPE_CHECKING:
    from serving.profiles.model import Profile

DEFAULT_GPU = "rtx-4090"


def profile_model_ref(profile: Profile) -> str:
    """The `--model` value for a profile: `builtin:NAME` is the project-built model's dir."""
    if profile.model.startswith(BUILTIN_PREFIX):
        name = profile.model.removeprefix(BUILTIN_PREFIX)
        path = models_dir() / name
        if not (path / "config.json").is_file():
            raise ServingError(
                f"profile {profile.name}: model {profile.model} is not built yet ({path}); "
                "build it with `serving model` or pass --model"
            )
        return str(path)
    return profile.model


def profile_settings(profile: Profile) -> PlanSettings:
    """PlanSettings carrying every engine setting of a profile."""
    return PlanSettings(
        tensor_parallel_size=profile.tensor_parallel_size,
        pipeline_parallel_size=profile.pipeline_parallel_size,
        # a profile counts GPUs per node; the planner counts them all
        gpu_count=profile.gpu_count * profile.nodes,
        gpus_per_node=profile.gpu_count if profile.nodes > 1 else None,
        dtype=profile.dtype,
        quantization=profile.quantization,
        kv_cache_dtype=profile.kv_cache_dtype,
        max_model_len=profile.max_model_len,
        gpu_memory_utilization=profile.gpu_memory_utilization,
        max_num_seqs=profile.max_num_seqs,
        max_num_batched_tokens=profile.max_num_batched_tokens,
        kv_space_gib=profile.cpu_kv_space_gib,
        block_size=profile.block_size,
        prefix_caching=profile.enable_prefix_caching,
        enforce_eager=profile.enforce_eager,
        images_per_prompt=profile.limit_mm_per_prompt.get("image"),
        runner=profile.runner,
        **_lora_settings(profile),
    )


def _lora_settings(profile: Profile) -> dict[str, Any]:
    """The LoRA limits of a profile with a `lora` section; none (vLLM's defaults) without."""
    if profile.lora is None:
        return {}
    return {
        "enable_lora": True,
        "max_loras": profile.lora.max_loras,
        "max_lora_rank": profile.lora.max_lora_rank,
    }


def profile_spec(profile: Profile) -> ModelSpec:
    """The model a profile plans with. A project-built model (`builtin:`) is planned from its
    build parameters, so no checkpoint is needed: its KV layout depends only on the
    architecture, the precision and the KV space."""
    if profile.model == f"{BUILTIN_PREFIX}qwen2.5-vl-tiny":
        from serving.models.tiny_vl_model import TinyVlParams, planned_config, preprocessor_config
        from serving.planner.config_json import spec_from_config

        vl = TinyVlParams()
        return spec_from_config(
            planned_config(vl),
            name=profile.model,
            source="TinyVlParams",
            preprocessor=preprocessor_config(vl),
        )
    if profile.model.startswith(BUILTIN_PREFIX):
        from serving.models.tiny_model import TinyModelParams, planned_vocab_size, qwen3_config
        from serving.models.tiny_tokenizer import special_token_ids
        from serving.planner.config_json import spec_from_config

        params = TinyModelParams()
        config = qwen3_config(params, planned_vocab_size(params), special_token_ids())
        return spec_from_config(config, name=profile.model, source="TinyModelParams")
    return resolve_model(profile.model)


def default_gpu() -> GpuSpec:
    """What `serving plan` assumes when neither a flag nor a profile names a GPU."""
    return get_gpu(DEFAULT_GPU)


def profile_gpu(profile: Profile) -> GpuSpec:
    return get_gpu("cpu" if profile.device == "cpu" else (profile.gpu or DEFAULT_GPU))


def profile_plan(profile: Profile) -> Plan:
    """What `serving plan --profile NAME` predicts for a profile, without flags."""
    settings = profile_settings(profile)
    if settings.quantization == "none" and names_awq(profile.model):
        settings = replace(settings, quantization="awq")
    return plan_for(profile_spec(profile), profile_gpu(profile), settings)
