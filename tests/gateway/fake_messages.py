"""The fake upstream's Anthropic Messages routes, as vLLM 0.32 answers them.

    POST /v1/messages               JSON, or the SSE events (message_start with the prompt's
                                    usage, a text block of one delta per word, message_delta
                                    with the final usage, message_stop). Usage: input 2 and
                                    cache_read 1 (a prompt of 3), output = words sent.
    POST /v1/messages/count_tokens  {"input_tokens": 7}
The model name picks a fault:
    fault-reset        the stream is cut after 2 deltas
    fault-in-band      2 deltas, then vLLM's `event: error`
    fault-echo         words that look like usage and event lines (adversarial content)
    fault-context      400 in vLLM's Anthropic error shape
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from aiohttp import web

from tests.gateway.fake_bodies import WORDS

if TYPE_CHECKING:
    from tests.gateway.fake_upstream import FakeUpstream

PROMPT_USAGE = {"input_tokens": 2, "cache_read_input_tokens": 1}
PROMPT_TOKENS = 3
# Text a client could have sent, echoed back by the model: it must never be read as usage.
ECHO_WORDS = [
    '"usage":{"input_tokens":0,"output_tokens":0}',
    '\n\nevent: message_delta\ndata: {"type":"message_delta","usage":{"output_tokens":0}}',
    ' {"type":"message_delta","usage":{"input_tokens":0,"output_tokens":0}}',
]
VLLM_MESSAGES_400 = {
    "type": "error",
    "error": {"type": "BadRequestError", "message": "The prompt is longer than the context."},
}


def event(kind: str, **fields: Any) -> bytes:
    """One Messages stream event as vLLM writes it: an `event:` line, then its JSON."""
    data = json.dumps({"type": kind, **fields}, separators=(",", ":"))
    return f"event: {kind}\ndata: {data}\n\n".encode()


def message(words: list[str]) -> dict[str, Any]:
    return {
        "id": "msg-fake",
        "type": "message",
        "role": "assistant",
        "model": "fake",
        "content": [{"type": "text", "text": "".join(words)}],
        "stop_reason": "end_turn",
        "usage": {**PROMPT_USAGE, "output_tokens": len(words)},
    }


async def messages(upstream: FakeUpstream, request: web.Request) -> web.StreamResponse:
    body = await request.json()
    upstream.keep(request, body)
    model = body.get("model")
    if model == "fault-context":
        return web.json_response(VLLM_MESSAGES_400, status=400)
    words = ECHO_WORDS if model == "fault-echo" else WORDS
    words = words[: min(len(words), body.get("max_tokens") or len(words))]
    if not body.get("stream"):
        return web.json_response(message(words))
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    start = {**message([]), "content": [], "usage": {**PROMPT_USAGE, "output_tokens": 0}}
    await response.write(event("message_start", message=start))
    block = {"type": "text", "text": ""}
    await response.write(event("content_block_start", index=0, content_block=block))
    for index, word in enumerate(words):
        delta = {"type": "text_delta", "text": word}
        await response.write(event("content_block_delta", index=0, delta=delta))
        await asyncio.sleep(upstream.chunk_delay_s)
        if index == 1 and model == "fault-reset":
            assert request.transport is not None
            request.transport.abort()
            await asyncio.sleep(10)
        if index == 1 and model == "fault-in-band":
            error = {"type": "internal_error", "message": "engine failed"}
            await response.write(event("error", error=error))
            return response
    await response.write(event("content_block_stop", index=0))
    usage = {**PROMPT_USAGE, "output_tokens": len(words)}
    stop: dict[str, str | None] = {"stop_reason": "end_turn", "stop_sequence": None}
    await response.write(event("message_delta", delta=stop, usage=usage))
    await response.write(event("message_stop"))
    return response


async def count_tokens(upstream: FakeUpstream, request: web.Request) -> web.StreamResponse:
    upstream.keep(request, await request.json())
    return web.json_response({"input_tokens": 7})
