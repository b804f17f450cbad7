"""The JSON schemas of a chat request (tool parameters, `response_format`), checked before
admission.

vLLM checks the shape of `tools` and `response_format` itself and names the field in its 400
(`"param": "body.tools.0.function.name"`); the gateway relays those as vLLM wrote them, and
charges nothing. What vLLM cannot name is a schema that is no JSON Schema at all
(`{"type": "objekt"}`): its grammar compiler refuses it with `"param": null`, after the request
took a slot and reached the engine. So the gateway checks each schema against its meta-schema
first and answers a 400 that names the field:

    check_schemas(data)   # or InvalidRequestError(param="tools[0].function.parameters")

Anything else (a tool without a name, `tools` not a list) is left to vLLM. Agents send the
same tools every turn, so verdicts are cached by the schema's JSON text.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from jsonschema.exceptions import SchemaError  # type: ignore[import-untyped]
from jsonschema.validators import Draft202012Validator, validator_for  # type: ignore[import-untyped]

from serving.gateway.errors import InvalidRequestError


def check_schemas(data: dict[str, Any]) -> None:
    """Raise InvalidRequestError naming the first tool or response schema that is not a JSON
    Schema; schemas in a shape vLLM refuses anyway are not looked at."""
    tools = data.get("tools")
    if isinstance(tools, list):
        for index, tool in enumerate(tools):
            function = tool.get("function") if isinstance(tool, dict) else None
            if isinstance(function, dict):
                _check(function.get("parameters"), f"tools[{index}].function.parameters")
    response_format = data.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") == "json_schema":
        spec = response_format.get("json_schema")
        if isinstance(spec, dict):
            _check(spec.get("schema"), "response_format.json_schema.schema")


def _check(schema: object, param: str) -> None:
    if not isinstance(schema, dict):
        return  # absent (a tool without parameters), or vLLM's own 400
    problem = schema_problem(json.dumps(schema, sort_keys=True, ensure_ascii=False))
    if problem is not None:
        raise InvalidRequestError(f"{param} is not a valid JSON Schema: {problem}", param=param)


@functools.lru_cache(maxsize=512)
def schema_problem(text: str) -> str | None:
    """Why the schema in `text` (JSON) breaks its meta-schema (the draft its `$schema` names,
    else 2020-12, as xgrammar reads it), or None when it is a JSON Schema."""
    schema = json.loads(text)
    try:
        validator_for(schema, default=Draft202012Validator).check_schema(schema)
    except SchemaError as exc:
        where = "".join(f"[{part!r}]" for part in exc.path)
        return f"{exc.message}" + (f" (at {where})" if where else "")
    return None
