"""Upper bounds of a request's prompt tokens, from the fields vLLM renders into the prompt.

    chat_prompt_estimate(data, images)        # /v1/chat/completions
    completion_prompt_estimates(prompt)       # /v1/completions: one per prompt

"Never over a limit" depends on these being upper bounds: a byte-level BPE (Qwen's
tokenizers, after normalising to NFC) never makes more tokens than the UTF-8 bytes of the
NFC form, and the ChatML template adds at most
`PER_MESSAGE_TOKENS` per message plus `BASE_TOKENS` (the assistant prefix, an empty think
block, a default system prompt) and `TOOLS_TOKENS` (the tool-use preamble) when tools are
given. An image content part counts its image's tokens by the model's resize rule (`images`),
never the length of its base64. Which fields are counted at all is `request_fields`' table;
the fields a template may render besides the messages (tools, documents, the
chat_template_kwargs it reads, response_format, tool_choice) are counted by their JSON text.
"""

from __future__ import annotations

import json
import unicodedata
from typing import Any

from serving.gateway.errors import InvalidRequestError
from serving.gateway.images import (
    IMAGE_PART_TOKENS,
    ImageError,
    ImagePolicy,
    image_url_of,
    read_data_url,
)

PER_MESSAGE_TOKENS = 8
BASE_TOKENS = 96
TOOLS_TOKENS = 1024
# Request fields a chat template renders besides the messages, and the tool preamble each
# brings (chat_template_kwargs' tools and documents render as the top-level ones do).
_RENDERED_EXTRAS = (("tools", TOOLS_TOKENS), ("functions", TOOLS_TOKENS), ("documents", 0))
_SMALL_EXTRAS = ("response_format", "tool_choice", "reasoning_effort")


def chat_prompt_estimate(data: dict[str, Any], images: ImagePolicy) -> int:
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _invalid("messages", "'messages' must be a non-empty array of message objects.")
    total = BASE_TOKENS
    seen = [0]
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise _invalid("messages", "Each entry of 'messages' must be an object.")
        total += PER_MESSAGE_TOKENS
        for name, value in message.items():  # role, content, name, tool_calls, ...
            if name != "content" or not isinstance(value, list):
                total += text_bytes(value)
            else:
                total += content_tokens(value, f"messages[{index}].content", images, seen)
    kwargs = data.get("chat_template_kwargs")
    for source in (data, kwargs) if isinstance(kwargs, dict) else (data,):
        for name, preamble in _RENDERED_EXTRAS:
            value = source.get(name)
            if value:
                total += text_bytes(value) + preamble
    for name in _SMALL_EXTRAS:
        total += text_bytes(data.get(name))
    return total


def content_tokens(parts: list[Any], where: str, images: ImagePolicy, seen: list[int]) -> int:
    """The tokens of a content part list: images by their size, other parts by their JSON
    text. `seen` holds the images counted so far in the request (one item, updated)."""
    total = 0
    for number, part in enumerate(parts):
        tokens = _image_part_tokens(part, f"{where}[{number}]", images, seen[0])
        if tokens is None:
            total += text_bytes(part)
        else:
            total += tokens
            seen[0] += 1
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
        return [text_bytes(prompt) + 1]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(item, int) and not isinstance(item, bool) for item in prompt):
            return [len(prompt)]
        estimates = []
        for item in prompt:
            if isinstance(item, str):
                estimates.append(text_bytes(item) + 1)
            elif isinstance(item, list) and all(isinstance(token, int) for token in item):
                estimates.append(len(item))
            else:
                break
        else:
            return estimates
    raise _invalid(
        "prompt", "'prompt' must be a string, an array of strings, or an array of token ids."
    )


def text_bytes(value: object) -> int:
    """UTF-8 bytes of a string's NFC form; of anything else, of its JSON text (which holds
    every string). Qwen's tokenizers normalise to NFC before the byte-level BPE, and NFC can
    make a string up to three times its own bytes (U+FB2C: 3 -> 6)."""
    if value is None:
        return 0
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    if text.isascii():  # NFC keeps ASCII as it is
        return len(text)
    return len(unicodedata.normalize("NFC", text).encode("utf-8", "surrogatepass"))


def _invalid(param: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(message, param=param)
