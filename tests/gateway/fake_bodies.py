"""What the fake vLLM server (`fake_upstream`) answers: SSE events, chat and text chunks, usage
chunks and vLLM's error bodies, shared with the tests that check the gateway's reading of them."""

from __future__ import annotations

import json
from typing import Any


def sse(payload: object) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def chat_chunk(index: int, content: str, finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "fake",
        "choices": [
            {
                "index": 0,
                "delta": {"role": "assistant", "content": content}
                if index == 0
                else {"content": content},
                "finish_reason": finish,
            }
        ],
    }


CHAT_COMPLETION: dict[str, Any] = {
    "id": "chatcmpl-fake",
    "object": "chat.completion",
    "created": 0,
    "model": "fake",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "hello there"},
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
}

VLLM_400 = {
    "error": {
        "message": "max_tokens must be at least 1, got -1.",
        "type": "BadRequestError",
        "param": "max_tokens",
        "code": 400,
    }
}


WORDS = ["one", " two", " three", " four"]

TEXT_COMPLETION: dict[str, Any] = {
    "id": "cmpl-fake",
    "object": "text_completion",
    "created": 0,
    "model": "fake",
    "choices": [{"index": 0, "text": "hello there", "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
}

VLLM_STREAM_ERROR = {
    "error": {"message": "engine died", "type": "InternalServerError", "code": 500}
}

VLLM_CONTEXT_400 = {
    "error": {
        "message": "This model's maximum context length is 2048 tokens.",
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }
}


def text_chunk(index: int, text: str, finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "cmpl-fake",
        "object": "text_completion",
        "created": 0,
        "model": "fake",
        "choices": [{"index": 0, "text": text, "finish_reason": finish}],
    }


def chunk_for(chat: bool, index: int, text: str, finish: str | None = None) -> dict[str, Any]:
    return chat_chunk(index, text, finish) if chat else text_chunk(index, text, finish)


def usage_chunk(chat: bool, *, completion_tokens: int) -> dict[str, Any]:
    """vLLM's last chunk when usage is asked for: no choices, only usage."""
    return {
        "id": "chatcmpl-fake" if chat else "cmpl-fake",
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": 0,
        "model": "fake",
        "choices": [],
        "usage": {
            "prompt_tokens": 3,
            "completion_tokens": completion_tokens,
            "total_tokens": 3 + completion_tokens,
        },
    }


def responses_usage(output_tokens: int) -> dict[str, int]:
    return {"input_tokens": 3, "output_tokens": output_tokens, "total_tokens": 3 + output_tokens}


def response_object(status: str, words: list[str], usage: bool = True) -> dict[str, Any]:
    """A Responses API `response` object (vLLM's fields that the gateway reads)."""
    text = " ".join(words)
    message = {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text}],
    }
    body: dict[str, Any] = {
        "id": "resp_fake",
        "object": "response",
        "model": "fake",
        "status": status,
    }
    body["output"] = [message] if words else []
    if usage:
        body["usage"] = responses_usage(len(words))
    return body


def responses_event(kind: str, **fields: Any) -> bytes:
    """One Responses stream event as vLLM sends it: an `event:` line and its JSON."""
    return f"event: {kind}\n".encode() + sse({"type": kind, **fields})
