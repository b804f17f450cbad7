"""The JSON schemas of a metered request (tool parameters, `response_format`,
`structured_outputs.json`, a Responses `text.format`), each checked against its meta-schema
once the request is admitted (docs/gateway.md, the order of checks).

    check_schemas(data)   # or InvalidRequestError(param="tools[0].function.parameters")

Rules:
- checked after admission (`openai_request.check_admitted`): compiling is the costliest
  check, so a key at its limit gets its 429 without one; a 400 here withdraws the reservation;
- only what vLLM cannot name is checked: a schema that is no JSON Schema (`{"type": "objekt"}`)
  reaches vLLM's grammar compiler, which refuses it with `"param": null` after it took a slot;
  the shape of `tools` and `response_format` is left to vLLM, whose 400s name the field;
- verdicts are cached by the schema's JSON text (agents send the same tools every turn).
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

from jsonschema.exceptions import SchemaError  # type: ignore[import-untyped]
from jsonschema.validators import Draft202012Validator, validator_for  # type: ignore[import-untyped]

from serving.gateway.errors import InvalidRequestError


def check_schemas(data: dict[str, Any], kind: str = "chat") -> None:
    """Raise InvalidRequestError naming the first tool, response or structured-output schema
    of a `kind` request ("chat", "completion", "responses", "messages") that is not a JSON
    Schema; schemas in a shape vLLM refuses anyway are not looked at."""
    if kind == "messages":
        _check_messages_schemas(data)
        return
    tools = data.get("tools")
    if isinstance(tools, list) and kind != "completion":
        for index, tool in enumerate(tools):
            if not isinstance(tool, dict):
                continue
            if kind == "responses":  # its function tools carry their parameters themselves
                _check(tool.get("parameters"), f"tools[{index}].parameters")
            elif isinstance(function := tool.get("function"), dict):
                _check(function.get("parameters"), f"tools[{index}].function.parameters")
    if kind == "responses":
        text = data.get("text")
        formats = text.get("format") if isinstance(text, dict) else None
        if isinstance(formats, dict) and formats.get("type") == "json_schema":
            _check(formats.get("schema"), "text.format.schema")
        return
    response_format = data.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") == "json_schema":
        spec = response_format.get("json_schema")
        if isinstance(spec, dict):
            _check(spec.get("schema"), "response_format.json_schema.schema")
    structured = data.get("structured_outputs")
    if isinstance(structured, dict) and (schema := structured.get("json")) is not None:
        if isinstance(schema, str):  # vLLM takes the schema as JSON text too
            try:
                schema = json.loads(schema)
            except (ValueError, RecursionError):
                message = "structured_outputs.json is not JSON text."
                raise InvalidRequestError(message, param="structured_outputs.json") from None
        _check(schema, "structured_outputs.json")


def _check_messages_schemas(data: dict[str, Any]) -> None:
    """An Anthropic Messages body's schemas: each tool's `input_schema`, and
    `output_config.format.schema` (vLLM's response_format)."""
    tools = data.get("tools")
    if isinstance(tools, list):
        for index, tool in enumerate(tools):
            if isinstance(tool, dict):
                _check(tool.get("input_schema"), f"tools[{index}].input_schema")
    config = data.get("output_config")
    output = config.get("format") if isinstance(config, dict) else None
    if isinstance(output, dict):
        _check(output.get("schema"), "output_config.format.schema")


def _check(schema: object, param: str) -> None:
    if not isinstance(schema, dict):
        return  # absent (a tool without parameters), or vLLM's own 400
    try:
        text = json.dumps(schema, sort_keys=True, ensure_ascii=False)
    except RecursionError:
        raise InvalidRequestError(f"{param} is nested too deeply.", param=param) from None
    # Cached by their text only up to CACHED_SCHEMA_CHARS: the cache holds at most
    # 512 x 16 Ki characters, whatever bodies arrive.
    problem = schema_problem(text) if len(text) <= CACHED_SCHEMA_CHARS else _problem(schema)
    if problem is not None:
        raise InvalidRequestError(f"{param} is not a valid JSON Schema: {problem}", param=param)


CACHED_SCHEMA_CHARS = 16 * 1024


@functools.lru_cache(maxsize=512)
def schema_problem(text: str) -> str | None:
    """Why the schema in `text` (JSON) breaks its meta-schema (the draft its `$schema` names,
    else 2020-12, as xgrammar reads it), or None when it is a JSON Schema."""
    return _problem(json.loads(text))


def _problem(schema: dict[str, Any]) -> str | None:
    dialect = schema.get("$schema", _DEFAULT_DIALECT)
    if not isinstance(dialect, str):
        return "'$schema' must be a URI string"
    try:
        validator_for(schema, default=Draft202012Validator).check_schema(schema)
    except SchemaError as exc:
        where = "".join(f"[{part!r}]" for part in exc.path)
        return f"{exc.message}" + (f" (at {where})" if where else "")
    except RecursionError:
        return "it is nested too deeply"
    except (OverflowError, ValueError, re.error) as exc:  # e.g. a pattern `a{4294967296}`
        return f"it cannot be compiled ({exc})"
    return _ref_problem(schema)


_DEFAULT_DIALECT = "https://json-schema.org/draft/2020-12/schema"
# A schema's nodes walked for its `$ref`s before the gateway gives up on it.
MAX_SCHEMA_NODES = 100_000


def _ref_problem(schema: dict[str, Any]) -> str | None:
    """A `$ref` no grammar can be built from: one pointing outside the schema, at nothing,
    or at itself through other bare `$ref`s (a loop that never reaches a type)."""
    stack: list[object] = [schema]
    visited = 0
    while stack:
        node = stack.pop()
        visited += 1
        if visited > MAX_SCHEMA_NODES:
            return "it is too large"
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        ref = node.get("$ref")
        if ref is not None:
            problem = _follow(schema, ref)
            if problem is not None:
                return problem
        stack.extend(node.values())
    return None


def _follow(root: dict[str, Any], ref: object) -> str | None:
    seen: set[str] = set()
    while True:
        if not isinstance(ref, str) or not ref.startswith("#"):
            return f"$ref {ref!r} must point inside the schema ('#...')"
        if ref in seen:
            return f"$ref {ref!r} refers to itself"
        seen.add(ref)
        target = _resolve(root, ref)
        if target is None:
            return f"$ref {ref!r} points at nothing"
        if not isinstance(target, dict) or "$ref" not in target:
            return None
        ref = target["$ref"]


def _resolve(root: dict[str, Any], ref: str) -> object | None:
    """The node a local JSON pointer (`#/$defs/a`) names, or None."""
    node: object = root
    pointer = ref[1:]
    if not pointer:
        return root
    if not pointer.startswith("/"):
        return None  # an anchor name: not resolved here, so not accepted
    for raw in pointer[1:].split("/"):
        part = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node
