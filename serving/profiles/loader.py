"""Find, read and validate profile files; turn pydantic errors into one readable line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from serving.errors import ServingError
from serving.profiles.model import Profile

PROFILES_DIR = Path(__file__).parent


def builtin_profile_names() -> list[str]:
    return sorted(path.stem for path in PROFILES_DIR.glob("*.yaml"))


def _resolve(name_or_path: str) -> Path:
    candidate = Path(name_or_path)
    if candidate.suffix in {".yaml", ".yml"} or candidate.exists():
        if not candidate.is_file():
            raise ServingError(f"profile file {name_or_path} does not exist")
        return candidate
    builtin = PROFILES_DIR / f"{name_or_path}.yaml"
    if not builtin.is_file():
        known = ", ".join(builtin_profile_names())
        raise ServingError(f"unknown profile {name_or_path!r} (known: {known})")
    return builtin


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    field = ".".join(str(part) for part in error["loc"]) or "profile"
    message = str(error["msg"]).removeprefix("Value error, ")
    value = error.get("input")
    shown = "" if isinstance(value, dict) or not error["loc"] else f" (got {value!r})"
    return f"field '{field}': {message}{shown}"


def parse_profile(data: Any, *, source: str, default_name: str) -> Profile:
    if not isinstance(data, dict):
        raise ServingError(
            f"profile {source}: expected a mapping of fields, got {type(data).__name__}"
        )
    data = {"name": default_name, **data}
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        raise ServingError(f"profile {source}: {_first_error(exc)}") from None


def load_profile(name_or_path: str) -> Profile:
    """Load a built-in profile by name (e.g. `cpu-tiny`) or any YAML file by path."""
    path = _resolve(name_or_path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ServingError(
            f"profile {path.name}: not valid YAML ({exc})".replace("\n", " ")
        ) from None
    return parse_profile(data, source=path.name, default_name=path.stem)


def load_all_profiles() -> list[Profile]:
    return [load_profile(name) for name in builtin_profile_names()]
