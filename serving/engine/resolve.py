"""Turn a profile's `model` and LoRA adapters into what vLLM loads: built-ins are built on demand.

model_path = resolve_model(profile)        # a directory or a hub name
adapters = resolve_adapters(profile)       # {"team-a": "/.../models/qwen3-tiny-lora"}
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from serving.errors import ServingError
from serving.models.tiny_embedding import MODEL_NAME as TINY_EMBEDDING
from serving.models.tiny_lora import ADAPTER_NAME as TINY_LORA
from serving.models.tiny_model import MODEL_NAME as TINY_MODEL
from serving.models.tiny_reranker import MODEL_NAME as TINY_RERANKER
from serving.models.tiny_vl_model import MODEL_NAME as TINY_VL_MODEL
from serving.profiles.model import Profile
from serving.quantize.awq_build import TINY_AWQ_NAME


def _tiny() -> Path:
    from serving.models.tiny_model import ensure_tiny_model

    return ensure_tiny_model()


def _tiny_awq() -> Path:
    from serving.quantize.awq_build import ensure_tiny_awq_model

    return ensure_tiny_awq_model()


def _tiny_embedding() -> Path:
    from serving.models.tiny_embedding import ensure_tiny_embedding

    return ensure_tiny_embedding()


def _tiny_reranker() -> Path:
    from serving.models.tiny_reranker import ensure_tiny_reranker

    return ensure_tiny_reranker()


def _tiny_vl() -> Path:
    from serving.models.tiny_vl_model import ensure_tiny_vl_model

    return ensure_tiny_vl_model()


# Built-in model name -> builder returning the model directory (cached after the first build).
BUILTIN_MODELS: dict[str, Callable[[], Path]] = {
    TINY_MODEL: _tiny,
    TINY_AWQ_NAME: _tiny_awq,
    TINY_VL_MODEL: _tiny_vl,
    TINY_EMBEDDING: _tiny_embedding,
    TINY_RERANKER: _tiny_reranker,
}


def _tiny_lora() -> Path:
    from serving.models.tiny_lora import ensure_tiny_lora

    return ensure_tiny_lora()


# Built-in adapter name (`path: builtin:NAME`) -> builder returning its PEFT directory.
BUILTIN_ADAPTERS: dict[str, Callable[[], Path]] = {
    TINY_LORA: _tiny_lora,
}


def resolve_model(profile: Profile) -> str:
    """A local directory or hub name for vLLM to serve (its `model` argument)."""
    name = profile.builtin_model
    if name is None:
        local = Path(profile.model).expanduser()
        return str(local.resolve()) if local.exists() else profile.model
    builder = BUILTIN_MODELS.get(name)
    if builder is None:
        known = ", ".join(sorted(BUILTIN_MODELS))
        raise ServingError(
            f"profile {profile.name}: field 'model': unknown builtin {name!r} (known: {known})"
        )
    return str(builder())


def resolve_adapters(profile: Profile) -> dict[str, str]:
    """Each LoRA adapter's name -> what vLLM loads: a built-in adapter's directory (built
    first if needed), a local directory made absolute, else the hub id as written."""
    resolved: dict[str, str] = {}
    for index, adapter in enumerate(profile.lora.adapters if profile.lora else ()):
        name = adapter.builtin
        if name is None:
            local = Path(adapter.path).expanduser()
            resolved[adapter.name] = str(local.resolve()) if local.exists() else adapter.path
            continue
        builder = BUILTIN_ADAPTERS.get(name)
        if builder is None:
            known = ", ".join(sorted(BUILTIN_ADAPTERS))
            raise ServingError(
                f"profile {profile.name}: field 'lora.adapters.{index}.path': unknown builtin "
                f"{name!r} (known: {known})"
            )
        resolved[adapter.name] = str(builder())
    return resolved
