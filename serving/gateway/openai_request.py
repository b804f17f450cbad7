"""The JSON body of a metered request (chat completions, completions, the Responses API,
Anthropic Messages, and the pooling routes: embeddings, score, rerank).

    request = parse_completion_request("chat", body)     # or InvalidRequestError (400)
    upstream_body = render_upstream_body(request, max_tokens=admission.max_tokens)

Parsing checks what admission needs (model, stream flags, max_tokens, how many choices), the
prompt estimate (`prompt_estimate`, `responses_request`, `pooling_request`: an upper bound
of the prompt's tokens; a pooling request generates nothing, its max_tokens is 0) and the
fields vLLM reads that no estimate can bound (`request_fields`: a 400 names them). The
checks too costly for a key at its limit (schemas) wait for admission: `check_admitted`.
Fields vLLM does not declare pass through: vLLM ignores them, so new OpenAI parameters do not
break clients. The multipliers of a reservation are bounded here, before any quota store
sees them: `n` (and `best_of`) at `MAX_CHOICES`, as OpenAI bounds `n`, max_tokens at
`MAX_TOKENS_LIMIT`, a pooling batch's inputs at `max_inputs`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import orjson

from serving.gateway.anthropic_request import messages_prompt_estimate
from serving.gateway.errors import InvalidRequestError
from serving.gateway.images import ImagePolicy
from serving.gateway.pooling_request import pooling_prompt_estimate
from serving.gateway.prompt_estimate import (
    BASE_TOKENS,
    PER_MESSAGE_TOKENS,
    TOOLS_TOKENS,
    chat_prompt_estimate,
    completion_prompt_estimates,
    text_bytes,
)
from serving.gateway.request_fields import POOLING, Kind, check_fields
from serving.gateway.responses_request import responses_prompt_estimate
from serving.gateway.tool_request import check_schemas
from serving.vllm_limits import DEFAULT_STREAM_INTERVAL

__all__ = [
    "BASE_TOKENS",
    "MAX_CHOICES",
    "PER_MESSAGE_TOKENS",
    "TOOLS_TOKENS",
    "CompletionRequest",
    "Kind",
    "chat_prompt_estimate",
    "check_count_tokens_body",
    "check_max_tokens",
    "check_tokenize_body",
    "parse_completion_request",
    "render_upstream_body",
]

# OpenAI's own bound on `n`.
MAX_CHOICES = 128
# No context window comes near it; it keeps every reservation a small integer in every
# store (Redis's counters are 64-bit, its Lua numbers doubles).
MAX_TOKENS_LIMIT = 1 << 31
# Deeper bodies are refused: every encoder on the way (the gateway's re-render, vLLM's own
# parsing and rendering) recurses per level, and Python's stops near 1,000 levels.
MAX_JSON_DEPTH = 256
# The field that holds a route's max_tokens, in the order vLLM prefers them.
_MAX_TOKENS_FIELDS: dict[Kind, tuple[str, ...]] = {
    "chat": ("max_completion_tokens", "max_tokens"),
    "completion": ("max_tokens",),
    "responses": ("max_output_tokens",),
    "messages": ("max_tokens",),
}


@dataclass(slots=True)
class CompletionRequest:
    kind: Kind
    body: bytes
    data: dict[str, Any]
    model: str
    stream: bool
    client_wants_usage: bool
    """The client asked for the usage chunk itself (`stream_options.include_usage`)."""
    client_wants_running_usage: bool
    """... and for usage in every chunk too (`stream_options.continuous_usage_stats`)."""
    requested_max_tokens: int | None
    """What vLLM would use: max_completion_tokens if set, else max_tokens (None: neither;
    0 on a pooling route, which generates nothing)."""
    choices: int
    """Sequences generated: n (or best_of) times the number of prompts."""
    prompts: int
    """Prompts of a completions batch (1 on the other routes)."""
    prompt_estimate: int
    """Upper bound of the prompt tokens of all prompts together."""
    longest_prompt_estimate: int

    @property
    def usage_upstream(self) -> bool:
        """A chat or completion stream: vLLM is asked for its usage, at the end and in every
        chunk (`render_upstream_body`). A Responses or Messages stream always carries its own
        (a Messages stream in its first and last events)."""
        return self.stream and (self.kind == "chat" or self.kind == "completion")

    @property
    def max_tokens_field(self) -> str:
        """The field the client set max_tokens in (or the route's usual one)."""
        names = _MAX_TOKENS_FIELDS.get(self.kind, ("max_tokens",))
        return next((name for name in names if self.data.get(name) is not None), names[-1])


def parse_completion_request(
    kind: Kind,
    body: bytes,
    *,
    images: ImagePolicy | None = None,
    max_inputs: int | None = None,
) -> CompletionRequest:
    """The parsed body, or `InvalidRequestError`; `images` prices image parts, `max_inputs`
    bounds a pooling batch (default: the settings' defaults)."""
    data = _json_object(body)
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise _invalid("model", f"'model' must be a non-empty string, got {model!r}.")
    check_fields(kind, data)
    if kind in POOLING:
        estimate = pooling_prompt_estimate(kind, data, max_inputs=max_inputs)
        return CompletionRequest(
            kind, body, data, model, stream=False, client_wants_usage=False,
            client_wants_running_usage=False, requested_max_tokens=0, choices=1, prompts=1,
            prompt_estimate=estimate, longest_prompt_estimate=estimate,
        )  # fmt: skip
    stream = _optional_bool(data, "stream")
    wants_usage = wants_running = False
    if kind == "chat" or kind == "completion":  # the other streams always carry their usage
        options = data.get("stream_options")
        if options is not None and not isinstance(options, dict):
            raise _invalid("stream_options", "'stream_options' must be an object or null.")
        wants_usage = options is not None and _optional_bool(
            options, "include_usage", "stream_options"
        )
        wants_running = (
            options is not None
            and wants_usage
            and _optional_bool(options, "continuous_usage_stats", "stream_options")
        )
    requested = _max_tokens(data, kind)
    if requested is None and kind == "messages":  # Anthropic's API requires it
        raise _invalid("max_tokens", "max_tokens: Field required.")
    images = images or ImagePolicy.defaults()
    prompts = 1
    if kind == "chat":
        n = _count(data, "n")
        estimate = longest = chat_prompt_estimate(data, images)
    elif kind == "responses":
        n = 1
        estimate = longest = responses_prompt_estimate(data, images)
    elif kind == "messages":
        n = 1
        estimate = longest = messages_prompt_estimate(data, images)
    else:
        estimates = completion_prompt_estimates(data.get("prompt"))
        suffix = text_bytes(data.get("suffix"))
        estimates = [one + suffix for one in estimates]
        estimate, longest, prompts = sum(estimates), max(estimates), len(estimates)
        n = max(_count(data, "n"), _count(data, "best_of"))
    if n * prompts > MAX_CHOICES:
        param = "prompt" if n == 1 else "n"
        raise _invalid(
            param, f"At most {MAX_CHOICES} sequences per request (n x prompts), got {n * prompts}."
        )
    return CompletionRequest(
        kind=kind,
        body=body,
        data=data,
        model=model,
        stream=stream,
        client_wants_usage=wants_usage,
        client_wants_running_usage=wants_running,
        requested_max_tokens=requested,
        choices=n * prompts,
        prompts=prompts,
        prompt_estimate=estimate,
        longest_prompt_estimate=longest,
    )


def check_admitted(request: CompletionRequest) -> None:
    """The checks too costly to run for a key at its limit, run once the request is admitted
    (InvalidRequestError: the caller withdraws the reservation). Today: the request's
    schemas, which vLLM's grammar would refuse without naming the field (a pooling route
    reads none)."""
    if request.kind not in POOLING:
        check_schemas(request.data, request.kind)


def check_tokenize_body(body: bytes, images: ImagePolicy) -> None:
    """vLLM's /tokenize renders a chat body (`messages`) as chat does, and tokenizes a
    `prompt` otherwise: the same checks of fields and media apply, no reservation."""
    data = _json_object(body)
    if "messages" in data:
        check_fields("chat", data)
        chat_prompt_estimate(data, images)


def check_count_tokens_body(body: bytes, images: ImagePolicy) -> None:
    """vLLM's /v1/messages/count_tokens renders a Messages body as /v1/messages does: the
    same checks of fields and media apply, no reservation."""
    data = _json_object(body)
    check_fields("messages", data)
    messages_prompt_estimate(data, images)


def render_upstream_body(
    request: CompletionRequest,
    *,
    max_tokens: int,
    model: str | None = None,
    priority: int = 0,
    stream_interval: int = DEFAULT_STREAM_INTERVAL,
) -> bytes:
    """The body sent to vLLM: the admitted max_tokens, and in chat and completion streams
    usage always asked for, in every chunk too (`continuous_usage_stats`): a stream cut
    short is charged vLLM's own count so far, which one token per event undercounts once
    vLLM merged tokens into one event for a reader that fell behind. What the client did
    not ask for is stripped again (`ResponseMeter`). `model`, when it differs from the
    request's, replaces it (a key's default adapter); a `priority` other than 0 is the key's
    (a client's own is refused). In those streams a `stream_interval` above 1 is the
    gateway's (`GatewaySettings.stream_interval`; a client's own is refused). The client's
    own bytes when nothing changes."""
    force_usage = request.usage_upstream and not request.client_wants_running_usage
    if request.kind == "messages":
        priority = 0  # vLLM's Messages API has no priority to set
    interval = stream_interval if request.usage_upstream and stream_interval > 1 else 0
    new_model = model is not None and model != request.model
    unchanged = request.requested_max_tokens == max_tokens and not new_model and not priority
    if unchanged and not force_usage and not interval:
        return request.body
    data = request.data
    if interval:
        data["stream_interval"] = interval
    if new_model:
        data["model"] = model
    if priority:
        data["priority"] = priority
    if request.kind == "responses":
        data["max_output_tokens"] = max_tokens
    elif request.kind not in POOLING:  # a pooling route generates nothing
        data["max_tokens"] = max_tokens
        if data.get("max_completion_tokens") is not None:  # vLLM prefers it
            data["max_completion_tokens"] = max_tokens
    if force_usage:
        options = data.get("stream_options") or {}
        data["stream_options"] = options | {"include_usage": True, "continuous_usage_stats": True}
    try:
        return json.dumps(data, separators=(",", ":")).encode()
    except RecursionError:  # json.loads read it, but no encoder (vLLM's included) nests as deep
        raise InvalidRequestError("The request body is nested too deeply.", param=None) from None


# 19 digits in a row may be an integer past 64 bits, which orjson reads as a float where the
# standard library (and vLLM, which parses with it) reads the exact integer. Found by mapping
# every digit to 0 and everything else to a space, then one substring search (cheaper than a
# regex).
_DIGITS_AS_ZEROS = bytes(48 if 48 <= byte <= 57 else 32 for byte in range(256))
_LONG_DIGITS = b"0" * 19


def read_json_body(body: bytes) -> Any:
    """`json.loads`, through orjson (faster) where that gives the same value. The standard
    library decides whatever orjson refuses (it accepts more: NaN, a byte order mark,
    UTF-16, lone surrogates) and any body with an integer orjson might not hold exactly."""
    if _LONG_DIGITS not in body.translate(_DIGITS_AS_ZEROS):
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            pass
    return json.loads(body)


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        data = read_json_body(body)
    except (ValueError, RecursionError) as exc:
        detail = "nested too deeply" if isinstance(exc, RecursionError) else "not valid JSON"
        raise InvalidRequestError(
            f"We could not parse the JSON body of your request ({detail}). "
            "Send a JSON object with Content-Type: application/json."
        ) from None
    if not isinstance(data, dict):
        raise InvalidRequestError("The request body must be a JSON object.")
    # Two C-level counts rule out deep nesting for almost every body before any walk.
    if body.count(b"[") + body.count(b"{") > MAX_JSON_DEPTH and _deeper_than(data, MAX_JSON_DEPTH):
        raise InvalidRequestError(
            f"The request body is nested more than {MAX_JSON_DEPTH} levels deep."
        )
    return data


def _deeper_than(value: object, limit: int) -> bool:
    """Whether `value` nests objects and arrays more than `limit` levels deep."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(node, dict):
            stack.extend(
                (child, depth + 1) for child in node.values() if isinstance(child, (dict, list))
            )
        elif isinstance(node, list):
            stack.extend((child, depth + 1) for child in node if isinstance(child, (dict, list)))
    return False


def _max_tokens(data: dict[str, Any], kind: Kind) -> int | None:
    checked = [check_max_tokens(data.get(name), name) for name in _MAX_TOKENS_FIELDS[kind]]
    return next((value for value in checked if value is not None), None)


def check_max_tokens(value: object, param: str = "max_tokens") -> int | None:
    """A client's `max_tokens` (or `max_completion_tokens`) as JSON-decoded: the integer,
    `None` when absent (JSON null), else a 400 naming `param`. Capping it to the key's
    limit is `QuotaEngine.allowed_max_tokens`'s job; this only rejects nonsense."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _invalid(param, f"{param} must be an integer, got {value!r}")
    if value < 1:
        raise _invalid(param, f"{param} must be at least 1, got {value}")
    if value > MAX_TOKENS_LIMIT:
        raise _invalid(param, f"{param} must be at most {MAX_TOKENS_LIMIT}, got {value}")
    return value


def _optional_bool(data: dict[str, Any], name: str, where: str | None = None) -> bool:
    value = data.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        param = f"{where}.{name}" if where else name
        raise _invalid(param, f"'{param}' must be a boolean, got {value!r}.")
    return value


def _count(data: dict[str, Any], name: str) -> int:
    value = data.get(name)
    if value is None:
        return 1
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CHOICES:
        raise _invalid(name, f"'{name}' must be an integer from 1 to {MAX_CHOICES}, got {value!r}.")
    return value


def _invalid(param: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(message, param=param)
