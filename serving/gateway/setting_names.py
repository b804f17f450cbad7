"""How the gateway's settings are named outside Python: each field's flag and environment
variable, and a validation failure worded with them (`settings.GatewaySettings`).

    flag_name("keys_db")           # "--keys-db"
    env_name("keys_db")            # "SERVING_GATEWAY_KEYS_DB"
    settings_error(exc, GatewaySettings.model_fields)   # one ServingError naming each field
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import ValidationError
from pydantic.fields import FieldInfo

from serving.errors import ServingError

ENV_PREFIX = "SERVING_GATEWAY_"


def flag_name(field: str) -> str:
    return "--" + field.replace("_", "-")


def env_name(field: str) -> str:
    return ENV_PREFIX + field.upper()


def settings_error(exc: ValidationError, fields: Mapping[str, FieldInfo]) -> ServingError:
    """One line naming each bad field, its value, and where it can be set."""
    problems = []
    for error in exc.errors(include_url=False):
        name = str(error["loc"][0]) if error["loc"] else ""
        # a validator's own ValueError, without pydantic's "Value error, " in front
        reason = str(error["ctx"]["error"]) if error["type"] == "value_error" else error["msg"]
        if not name:
            problems.append(reason)
        elif name not in fields:
            problems.append(f"{name}: not a gateway setting")
        elif error["type"] == "missing":
            problems.append(f"{name}: required ({flag_name(name)} or {env_name(name)})")
        else:
            # Fields kept out of the repr (keys, a Redis URL's password) stay out of errors.
            shown = repr(error["input"]) if fields[name].repr else "(hidden)"
            problems.append(
                f"{name}: {shown} is not valid: {reason} ({flag_name(name)} or {env_name(name)})"
            )
    return ServingError("; ".join(problems))
