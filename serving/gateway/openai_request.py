"""The JSON body of a metered request (`/v1/chat/completions`, `/v1/completions`).

    request = parse_completion_request("chat", body)     # or InvalidRequestError (400)
    upstream_body = render_upstream_body(request, max_tokens=admission.max_tokens)

Parsing checks only what admission needs (model, stream flags, max_tokens, how many choices)
and leaves every other field for vLLM to judge, so new OpenAI parameters pass through.

The prompt estimate is an upper bound of the prompt's tokens, which "never over a limit"
depends on: a byte-level BPE (Qwen's tokenizers) never makes more tokens than UTF-8 bytes,
and the ChatML template adds at most `PER_MESSAGE_TOKENS` per message plus `BASE_TOKENS`
(the assistant prefix, an empty think block, a default system prompt) and `TOOLS_TOKENS`
(the tool-use preamble) when tools are given. An image content part counts its image's
tokens by the model's resize rule (`images`), never the length of its base64. A
request-supplied `chat_template` can add anything and is not accounted for.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from serving.gateway.errors import InvalidRequestError
from serving.gateway.images import (
    IMAGE_PART_TOKENS,
    ImageError,
    ImagePolicy,
    image_url_of,
    read_data_url,
)
from serving.gateway.tool_request import check_schemas

Kind = Literal["chat", "completion"]


class CompletionRoute(NamedTuple):
    kind: Kind
    path: str
    """vLLM's spelling of the path."""


COMPLETION_ROUTES: dict[str, CompletionRoute] = {
    "/v1/chat/completions": CompletionRoute("chat", "/v1/chat/completions"),
    "/v1/completions": CompletionRoute("completion", "/v1/completions"),
}


def completion_route(path: str) -> CompletionRoute | None:
    """The metered endpoint `path` reaches in vLLM, if any. vLLM (Starlette) also serves a
    path with one trailing slash added, through a redirect to its own address; the gateway
    meters such a variant and sends it to the canonical path instead."""
    route = COMPLETION_ROUTES.get(path)
    if route is None and path.endswith("/"):
        route = COMPLETION_ROUTES.get(path[:-1])
    return route


PER_MESSAGE_TOKENS = 8
BASE_TOKENS = 96
TOOLS_TOKENS = 1024
# Request fields a chat template renders besides the messages.
_RENDERED_EXTRAS = ("tools", "functions", "documents")


@dataclass(slots=True)
class CompletionRequest:
    kind: Kind
    body: bytes
    data: dict[str, Any]
    model: str
    stream: bool
    client_wants_usage: bool
    """The client asked for the usage chunk itself (`stream_options.include_usage`)."""
    requested_max_tokens: int | None
    """What vLLM would use: max_completion_tokens if set, else max_tokens (None: neither)."""
    choices: int
    """Sequences generated: n (or best_of) times the number of prompts."""
    prompt_estimate: int
    """Upper bound of the prompt tokens of all prompts together."""
    longest_prompt_estimate: int


def parse_completion_request(
    kind: Kind, body: bytes, *, images: ImagePolicy | None = None
) -> CompletionRequest:
    """The parsed body, or `InvalidRequestError`; `images` prices image parts (default:
    the settings' defaults)."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as exc:
        detail = "nested too deeply" if isinstance(exc, RecursionError) else "not valid JSON"
        raise InvalidRequestError(
            f"We could not parse the JSON body of your request ({detail}). "
            "Send a JSON object with Content-Type: application/json."
        ) from None
    if not isinstance(data, dict):
        raise InvalidRequestError("The request body must be a JSON object.")
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise _invalid("model", f"'model' must be a non-empty string, got {model!r}.")
    stream = _optional_bool(data, "stream")
    options = data.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise _invalid("stream_options", "'stream_options' must be an object or null.")
    wants_usage = options is not None and _optional_bool(options, "include_usage", "stream_options")
    requested = _max_tokens(data, kind)
    n = _count(data, "n")
    if kind == "chat":
        check_schemas(data)  # a schema vLLM's grammar would refuse without naming it
        estimate = longest = chat_prompt_estimate(data, images or ImagePolicy.defaults())
        prompts = 1
    else:
        estimates = completion_prompt_estimates(data.get("prompt"))
        estimate, longest, prompts = sum(estimates), max(estimates), len(estimates)
        n = max(n, _count(data, "best_of"))
    return CompletionRequest(
        kind=kind,
        body=body,
        data=data,
        model=model,
        stream=stream,
        client_wants_usage=wants_usage,
        requested_max_tokens=requested,
        choices=n * prompts,
        prompt_estimate=estimate,
        longest_prompt_estimate=longest,
    )


def render_upstream_body(request: CompletionRequest, *, max_tokens: int) -> bytes:
    """The body sent to vLLM: the admitted max_tokens, and usage always asked for in streams
    (the usage chunk is stripped again when the client did not ask for it). The client's
    own bytes when nothing changes (vLLM takes max_completion_tokens over max_tokens)."""
    force_usage = request.stream and not request.client_wants_usage
    if request.requested_max_tokens == max_tokens and not force_usage:
        return request.body
    data = request.data
    data["max_tokens"] = max_tokens
    if data.get("max_completion_tokens") is not None:
        data["max_completion_tokens"] = max_tokens
    if force_usage:
        data["stream_options"] = {"include_usage": True}
    return json.dumps(data, separators=(",", ":")).encode()


def chat_prompt_estimate(data: dict[str, Any], images: ImagePolicy) -> int:
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _invalid("messages", "'messages' must be a non-empty array of message objects.")
    total = BASE_TOKENS
    seen_images = 0
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise _invalid("messages", "Each entry of 'messages' must be an object.")
        total += PER_MESSAGE_TOKENS
        for name, value in message.items():  # role, content, name, tool_calls, ...
            if name != "content" or not isinstance(value, list):
                total += _text_bytes(value)
                continue
            for number, part in enumerate(value):
                where = f"messages[{index}].content[{number}]"
                tokens = _image_part_tokens(part, where, images, seen_images)
                if tokens is None:
                    total += _text_bytes(part)
                else:
                    total += tokens
                    seen_images += 1
    for name in _RENDERED_EXTRAS:
        value = data.get(name)
        if value:
            total += _text_bytes(value) + (TOOLS_TOKENS if name != "documents" else 0)
    return total


def _image_part_tokens(part: object, where: str, images: ImagePolicy, seen: int) -> int | None:
    """An image part's tokens (the image's by the model's rule, and the template's around
    it); None for any other part. Each 400 names the field at fault."""
    if not isinstance(part, dict):
        return None
    suffix = ""
    try:
        found = image_url_of(part)
        if found is None:
            return None
        url, suffix = found
        if seen >= images.max_images:
            suffix = ""
            if images.max_images == 0:
                raise ImageError("This server does not accept images: its model reads text.")
            raise ImageError(
                f"Too many images: at most {images.max_images} are accepted per request."
            )
        header = read_data_url(url)
        return images.image_tokens(header.width, header.height) + IMAGE_PART_TOKENS
    except ImageError as exc:
        raise _invalid(where + suffix, str(exc)) from None


def completion_prompt_estimates(prompt: object) -> list[int]:
    """One upper bound per prompt: text, token ids, or a batch of either."""
    if isinstance(prompt, str):
        return [_text_bytes(prompt) + 1]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(item, int) and not isinstance(item, bool) for item in prompt):
            return [len(prompt)]
        estimates = []
        for item in prompt:
            if isinstance(item, str):
                estimates.append(_text_bytes(item) + 1)
            elif isinstance(item, list) and all(isinstance(token, int) for token in item):
                estimates.append(len(item))
            else:
                break
        else:
            return estimates
    raise _invalid(
        "prompt", "'prompt' must be a string, an array of strings, or an array of token ids."
    )


def _text_bytes(value: object) -> int:
    """UTF-8 bytes of a string; of anything else, its JSON text (which holds every string)."""
    if value is None:
        return 0
    if isinstance(value, str):
        return len(value) if value.isascii() else len(value.encode("utf-8", "surrogatepass"))
    return len(json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass"))


def _max_tokens(data: dict[str, Any], kind: Kind) -> int | None:
    names = ("max_completion_tokens", "max_tokens") if kind == "chat" else ("max_tokens",)
    checked = [check_max_tokens(data.get(name), name) for name in names]
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
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _invalid(name, f"'{name}' must be an integer >= 1, got {value!r}.")
    return value


def _invalid(param: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(message, param=param)
