"""Measure one streamed chat completion from its SSE bytes: TTFT, ITL, usage, and validity.

Pure (no Locust, no I/O): the user feeds it chunks as they arrive with their arrival time.
Timing follows vLLM's own benchmark client (`vllm.benchmarks.serve`) so the two agree:
TTFT is the arrival of the first `data:` chunk carrying `choices`, each later such chunk adds
one inter-token latency, and end-to-end ends at the last token chunk (not the usage chunk).

A stream is valid only if it has a token chunk, a usage chunk and `[DONE]`, no in-band
`{"error": ...}` event, and (with `ignore_eos`) exactly the requested number of tokens.

Usage: `meter = StreamMeter(start); meter.feed(data, now); result = meter.finish(expected)`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass
class StreamResult:
    ok: bool
    error: str | None
    ttft_s: float | None
    itl_s: list[float]
    e2e_s: float | None
    prompt_tokens: int
    output_tokens: int

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first, as vLLM's benchmark defines it."""
        if self.ttft_s is None or self.e2e_s is None or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


@dataclass
class StreamMeter:
    start: float
    _buffer: bytes = b""
    _first: float | None = None
    _last: float | None = None
    _itl: list[float] = field(default_factory=list)
    _usage: dict[str, Any] | None = None
    _done: bool = False
    _error: str | None = None

    def feed(self, data: bytes, now: float) -> None:
        """Add bytes that arrived at `now` (same clock as `start`)."""
        self._buffer += data
        while True:
            end = self._buffer.find(b"\n")
            if end < 0:
                return
            line, self._buffer = self._buffer[:end].rstrip(b"\r"), self._buffer[end + 1 :]
            self._line(line, now)

    def _line(self, line: bytes, now: float) -> None:
        if not line.startswith(b"data:") or self._error is not None:
            return  # blank separators, comments (": ping"), event names
        payload = line[5:].strip()
        if payload == b"[DONE]":
            self._done = True
            return
        try:
            event = json.loads(payload)
        except ValueError:
            self._error = f"non-JSON SSE data: {payload[:80]!r}"
            return
        if not isinstance(event, dict):
            self._error = f"SSE data is not an object: {payload[:80]!r}"
        elif "error" in event:
            self._error = f"SSE error event: {_error_message(event['error'])}"
        elif event.get("choices"):
            if self._first is None:
                self._first = now
            elif self._last is not None:
                self._itl.append(now - self._last)
            self._last = now
        elif isinstance(event.get("usage"), dict):
            self._usage = event["usage"]

    def finish(self, *, expected_output_tokens: int | None = None) -> StreamResult:
        """The result; `expected_output_tokens` is checked when the request set ignore_eos."""
        usage = self._usage or {}
        prompt_tokens = _as_int(usage.get("prompt_tokens"))
        output_tokens = _as_int(usage.get("completion_tokens"))
        error = self._error
        if error is None:
            if self._first is None:
                error = "stream ended without a token chunk"
            elif self._usage is None:
                error = "stream ended without a usage chunk"
            elif not self._done:
                error = "stream ended without [DONE]"
            elif expected_output_tokens is not None and output_tokens != expected_output_tokens:
                error = f"{output_tokens} output tokens, expected {expected_output_tokens}"
        return StreamResult(
            ok=error is None,
            error=error,
            ttft_s=None if self._first is None else self._first - self.start,
            itl_s=list(self._itl),
            e2e_s=None if self._last is None else self._last - self.start,
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
        )


def _error_message(error: object) -> str:
    if isinstance(error, dict):
        return str(error.get("message") or error)
    return str(error)


def _as_int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
