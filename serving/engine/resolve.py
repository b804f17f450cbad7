"""Turn a profile's `model` into something vLLM can load: a built-in model is built on demand."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from serving.errors import ServingError
from serving.profiles.model import Profile


def _tiny() -> Path:
    from serving.models.tiny_model import ensure_tiny_model

    return ensure_tiny_model()


def _tiny_awq() -> Path:
    from serving.quantize.awq_build import ensure_tiny_awq_model

    return ensure_tiny_awq_model()


def _tiny_vl() -> Path:
    from serving.models.tiny_vl_model import ensure_tiny_vl_model

    return ensure_tiny_vl_model()


# Built-in model name -> builder returning the model directory (cached after the first build).
BUILTIN_MODELS: dict[str, Callable[[], Path]] = {
    "qwen3-tiny": _tiny,
    "qwen3-tiny-awq": _tiny_awq,
    "qwen2.5-vl-tiny": _tiny_vl,
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
