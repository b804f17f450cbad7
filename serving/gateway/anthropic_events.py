"""What an Anthropic Messages response says about its tokens, read from parsed JSON
(a whole body, or one event of a stream).

    message_usage(body["usage"])              # (prompt, completion) or None
    event_usage(event)                        # ("start" | "final", (prompt, completion))
    generated_bytes(sse_block)                # UTF-8 bytes of the text the model made

vLLM's Messages stream carries usage in two events only: `message_start` (the prompt,
`message.usage`) and `message_delta` (the final counts, `usage`); its other events carry
none, so a stream cut short is bounded by the text its deltas carried. Everything is read
from the event's `type`, never from text that could be the client's own echoed back.
"""

from __future__ import annotations

from typing import Any, Literal, TypeGuard

from serving.gateway.sse import event_data, json_value

# The prompt's tokens, split the way Anthropic reports them (vLLM's prompt_tokens is their
# sum: what is read from its prefix cache is still in the prompt it counted).
_PROMPT_FIELDS = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
# The event lines vLLM writes before the events that may show generated text (a client
# cannot write them: its text is inside the JSON of a `data:` line).
_SHOWS_TEXT = (b"event: content_block_delta", b"event: content_block_start")
# Where a content_block_delta's generated text sits, by the delta's type.
_DELTA_TEXT = {
    "text_delta": "text",
    "thinking_delta": "thinking",
    "input_json_delta": "partial_json",
}


def message_usage(value: object) -> tuple[int, int] | None:
    """(prompt tokens, output tokens) of a Messages usage object; None when it is not one
    (missing or negative counts, or counts that are not integers)."""
    if not isinstance(value, dict):
        return None
    output = value.get("output_tokens")
    if not _count(output):
        return None
    prompt = 0
    for name in _PROMPT_FIELDS:
        part = value.get(name)
        if part is None and name != "input_tokens":
            continue
        if not _count(part):
            return None
        prompt += part
    return prompt, output


def event_usage(event: dict[str, Any]) -> tuple[Literal["start", "final"], object] | None:
    """The usage object an event carries by its type: `message_start`'s (the prompt counted,
    nothing generated yet) or `message_delta`'s (the final counts); None for any other."""
    kind = event.get("type")
    if kind == "message_delta":
        return "final", event.get("usage")
    if kind == "message_start":
        message = event.get("message")
        return "start", message.get("usage") if isinstance(message, dict) else None
    return None


def generated_bytes(block: bytes) -> int:
    """UTF-8 bytes of what the model generated that the whole events of an SSE `block`
    show: content deltas' text (answer, thinking or tool arguments), tool_use blocks' names.
    Each event that may show some is parsed as JSON and read by its `type`."""
    if _SHOWS_TEXT[0] not in block and _SHOWS_TEXT[1] not in block:
        return 0
    total = 0
    for event in block.split(b"\n\n"):
        if _SHOWS_TEXT[0] in event or _SHOWS_TEXT[1] in event:
            data = json_value(event_data(event))
            total += _event_bytes(data) if isinstance(data, dict) else 0
    return total


def _event_bytes(event: dict[str, Any]) -> int:
    kind = event.get("type")
    text: object = None
    if kind == "content_block_delta":
        delta = event.get("delta")
        if isinstance(delta, dict):
            kind = delta.get("type")
            field = _DELTA_TEXT.get(kind) if isinstance(kind, str) else None
            text = delta.get(field) if field is not None else None
    elif kind == "content_block_start":
        block = event.get("content_block")
        if isinstance(block, dict) and block.get("type") == "tool_use":
            text = block.get("name")
    return len(text.encode("utf-8", "surrogatepass")) if isinstance(text, str) else 0


def _count(value: object) -> TypeGuard[int]:
    return type(value) is int and value >= 0
