"""The prompt estimate of a Responses API body (`POST /v1/responses`).

    tokens = responses_prompt_estimate(data, images)    # or InvalidRequestError

vLLM turns a Responses request into chat messages and renders them with the model's chat
template: `instructions` becomes a system message, `input` (a string, or a list of items:
messages with content parts, function calls and their outputs, reasoning) the turns, and
`tools` the template's tool block. So the estimate is the chat one's: UTF-8 bytes of every
rendered field (a byte-level BPE never makes more tokens than bytes) plus the template's
overhead per turn, images priced by their size (`images`), and the tool preamble when tools
are given. Only function tools are accepted: vLLM runs the built-in ones (web search, code
interpreter, MCP) itself, turn after turn, which no reservation made up front can bound.
"""

from __future__ import annotations

from typing import Any

from serving.gateway.errors import InvalidRequestError
from serving.gateway.images import ImagePolicy
from serving.gateway.prompt_estimate import (
    BASE_TOKENS,
    PER_MESSAGE_TOKENS,
    TOOLS_TOKENS,
    content_tokens,
    text_bytes,
)


def responses_prompt_estimate(data: dict[str, Any], images: ImagePolicy) -> int:
    total = BASE_TOKENS
    seen = [0]  # images so far, across every item
    instructions = data.get("instructions")
    if instructions is not None:
        total += PER_MESSAGE_TOKENS + text_bytes(instructions)
    value = data.get("input")
    if isinstance(value, str):
        total += PER_MESSAGE_TOKENS + text_bytes(value)
    elif isinstance(value, list) and value:
        for index, item in enumerate(value):
            total += PER_MESSAGE_TOKENS + _item_tokens(item, f"input[{index}]", images, seen)
    else:
        raise InvalidRequestError(
            "'input' must be a string or a non-empty array of input items.", param="input"
        )
    previous = data.get("previous_input_messages")
    if isinstance(previous, list):
        total += sum(PER_MESSAGE_TOKENS + text_bytes(message) for message in previous)
    elif previous is not None:
        raise InvalidRequestError(
            "'previous_input_messages' must be an array.", param="previous_input_messages"
        )
    tools = data.get("tools")
    if tools:
        _check_tools(tools)
        total += text_bytes(tools) + TOOLS_TOKENS
    for name in ("text", "tool_choice", "reasoning"):
        total += text_bytes(data.get(name))
    return total


def _item_tokens(item: object, where: str, images: ImagePolicy, seen: list[int]) -> int:
    if not isinstance(item, dict):
        raise InvalidRequestError(f"'{where}' must be an object.", param=where)
    total = 0
    for name, value in item.items():
        if name == "content" and isinstance(value, list):
            total += content_tokens(value, f"{where}.content", images, seen)
        else:
            total += text_bytes(value)
    return total


def _check_tools(tools: object) -> None:
    if not isinstance(tools, list):
        raise InvalidRequestError("'tools' must be an array.", param="tools")
    for index, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            param = f"tools[{index}].type"
            raise InvalidRequestError(
                f"'{param}' must be 'function': built-in tools ({kind!r}) run inside the "
                "engine for as many turns as they take, which this gateway cannot bound.",
                param=param,
            )
