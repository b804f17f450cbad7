"""The prompt estimate of an Anthropic Messages body (`POST /v1/messages`, and the body of
`/v1/messages/count_tokens`).

    tokens = messages_prompt_estimate(data, images)    # or InvalidRequestError

vLLM turns a Messages request into a chat request and renders it with the model's chat
template: `system` (a string or text blocks) becomes the system message, each message's
blocks become content parts, reasoning, tool calls (a `tool_use`'s `input` as `json.dumps`
arguments) or tool messages (a `tool_result`, up to three chat messages: its text, its
images, its tool references; in an assistant turn a Python `str()` of its content), and
`tools` (with the tools a system `tool_addition` block declares) the template's tool block
in OpenAI's function form. So each block is counted by the UTF-8 bytes of its JSON text, which
holds every string it renders; where vLLM writes a block's values as `json.dumps` (a
tool_use's input) or `str()` (an assistant's tool_result), by its JSON text with non-ASCII
escaped, at least as long as those spellings; plus the template's overhead of three chat
messages per block. Images are priced by their size (`images`), never by their base64; each
tool by its function form's JSON, plus the tool preamble once.
"""

from __future__ import annotations

import json
from typing import Any

from serving.gateway.errors import InvalidRequestError
from serving.gateway.images import IMAGE_PART_TOKENS, ImageError, ImagePolicy, read_data_url
from serving.gateway.prompt_estimate import (
    BASE_TOKENS,
    PER_MESSAGE_TOKENS,
    TOOLS_TOKENS,
    text_bytes,
)
from serving.gateway.request_fields import TEMPLATE_RENDERED

# A block renders as at most three chat messages (a tool_result: its text, its images, its
# tool references), each with the template's per-message overhead.
PER_BLOCK_TOKENS = 3 * PER_MESSAGE_TOKENS
# An assistant turn's tool_result is rendered as this text before its content's `str()`.
ASSISTANT_TOOL_RESULT_BYTES = len("Tool result: ")
_SMALL_EXTRAS = ("tool_choice", "thinking", "output_config")


def messages_prompt_estimate(data: dict[str, Any], images: ImagePolicy) -> int:
    """An upper bound of the prompt tokens vLLM renders from a Messages body."""
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _invalid("messages", "'messages' must be a non-empty array of message objects.")
    total = BASE_TOKENS
    seen = [0]  # images so far, across the whole request
    tool_changes = False
    system = data.get("system")
    if system is not None:
        total += PER_MESSAGE_TOKENS + _content_tokens(system, "system", "system", images, seen)
        tool_changes = _declares_tools(system)
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise _invalid(f"messages[{index}]", "Each entry of 'messages' must be an object.")
        role, content = message.get("role"), message.get("content")
        total += PER_MESSAGE_TOKENS + text_bytes(role)
        total += _content_tokens(content, f"messages[{index}].content", role, images, seen)
        tool_changes = tool_changes or _declares_tools(content)
    tools = data.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise _invalid("tools", "'tools' must be an array.")
    if tools or tool_changes:
        total += TOOLS_TOKENS
        total += sum(function_form_bytes(tool) for tool in tools or ())
    kwargs = data.get("chat_template_kwargs")
    if isinstance(kwargs, dict):  # its keys are checked by the field table
        for name in TEMPLATE_RENDERED:
            if kwargs.get(name):
                total += text_bytes(kwargs[name]) + TOOLS_TOKENS
    for name in _SMALL_EXTRAS:
        total += text_bytes(data.get(name))
    return total


def _content_tokens(
    content: object, where: str, role: object, images: ImagePolicy, seen: list[int]
) -> int:
    """A message's content: a string, or its blocks (anything else is counted by its JSON
    text, and refused by vLLM)."""
    if not isinstance(content, list):
        return text_bytes(content)
    total = 0
    for number, block in enumerate(content):
        where_block = f"{where}[{number}]"
        total += PER_BLOCK_TOKENS + _block_tokens(block, where_block, role, images, seen)
    return total


def _block_tokens(
    block: object, where: str, role: object, images: ImagePolicy, seen: list[int]
) -> int:
    """A block's tokens: its JSON text, which holds every string it renders (as UTF-8, or
    escaped where vLLM escapes), images by their size."""
    if not isinstance(block, dict):
        return text_bytes(block)
    kind = block.get("type")
    if kind == "image":
        return _image_tokens(block, where, images, seen)
    if kind == "tool_use":  # its input becomes `json.dumps` arguments, non-ASCII escaped
        return escaped_bytes(block)
    if kind == "tool_addition":  # its tool joins the tool block, in function form
        change = block.get("tool")
        definition = change.get("definition") if isinstance(change, dict) else None
        return text_bytes(block) + (function_form_bytes(definition) if definition else 0)
    if kind != "tool_result":
        return text_bytes(block)
    items = block.get("content")
    if role != "user":
        # Outside a user turn the whole content is written as its Python `str()`, images
        # included.
        return ASSISTANT_TOOL_RESULT_BYTES + escaped_bytes(block)
    if not isinstance(items, list):
        return text_bytes(block)
    # A user turn's tool_result: its images go to a user message of their own, priced by
    # size like any image; the rest is text.
    rest = {name: value for name, value in block.items() if name != "content"}
    total = text_bytes(rest)
    for number, item in enumerate(items):
        if isinstance(item, dict) and item.get("type") == "image":
            total += _image_tokens(item, f"{where}.content[{number}]", images, seen)
        else:
            total += text_bytes(item) + 1  # its separator in the joined text
    return total


def _image_tokens(block: dict[str, Any], where: str, images: ImagePolicy, seen: list[int]) -> int:
    """An image block's tokens by its size; only base64 sources (a URL is fetched by the
    engine, at a size the gateway cannot know, and from inside the cluster)."""
    try:
        if seen[0] >= images.max_images:
            if images.max_images == 0:
                raise ImageError("This server does not accept images: its model reads text.")
            raise ImageError(
                f"Too many images: at most {images.max_images} are accepted per request."
            )
        source = block.get("source")
        if not isinstance(source, dict):
            raise ImageError("An image block needs a 'source' object.")
        if source.get("type", "base64") != "base64":
            raise ImageError("Only base64 image sources are accepted (no URLs).")
        media_type, data = source.get("media_type", "image/jpeg"), source.get("data", "")
        if not isinstance(media_type, str) or not isinstance(data, str):
            raise ImageError("An image source's 'media_type' and 'data' must be strings.")
        header = read_data_url(f"data:{media_type};base64,{data}")
    except ImageError as exc:
        raise _invalid(f"{where}.source", str(exc)) from None
    seen[0] += 1
    return images.image_tokens(header.width, header.height) + IMAGE_PART_TOKENS


def function_form_bytes(tool: object) -> int:
    """A tool's bytes as the chat template gets it: OpenAI's function form, with the fields
    vLLM sets (null when absent) and the `"type": "object"` it gives a schema without one."""
    if not isinstance(tool, dict):
        return text_bytes(tool)
    schema = tool.get("input_schema")
    if isinstance(schema, dict) and "type" not in schema:
        schema = {"type": "object", **schema}
    function = {name: value for name, value in tool.items() if name != "input_schema"}
    function |= {name: tool.get(name) for name in ("description", "strict", "defer_loading")}
    return text_bytes({"type": "function", "function": {**function, "parameters": schema}})


def _declares_tools(content: object) -> bool:
    """Whether blocks add tools to the request's (`tool_addition`): the tool block is then
    rendered even without `tools`; the added tool itself is counted with its block."""
    return isinstance(content, list) and any(
        isinstance(block, dict) and block.get("type") == "tool_addition" for block in content
    )


def escaped_bytes(value: object) -> int:
    """The length of `value`'s JSON text with non-ASCII escaped: at least its UTF-8 bytes as
    text, as `json.dumps` arguments, and as a Python `str()` (each string's escapes are as
    long or longer, and the rest is spelled alike)."""
    if value is None:
        return 0
    if isinstance(value, str) and value.isascii():
        return len(value) + 2
    try:
        return len(json.dumps(value))
    except RecursionError:
        raise _invalid(None, "The request body is nested too deeply.") from None


def _invalid(param: str | None, message: str) -> InvalidRequestError:
    return InvalidRequestError(message, param=param)
