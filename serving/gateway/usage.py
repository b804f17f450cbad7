"""Reading vLLM's reported usage from a response as it is relayed, at minimal per-chunk cost.

    meter = ResponseMeter(strip_usage=True)
    meter.read_json(body)                  # a whole JSON body
    out = meter.feed(chunk) ... meter.end()  # an SSE stream: returns the bytes to relay

In chat and completion streams the gateway asks vLLM for usage in every chunk too
(`continuous_usage_stats`): `running_usage` is the last such count (what a stream cut short
is charged), and unless the client asked for them the per-chunk objects are cut out again
(a few C-level scans per event).

The Responses API reports its usage as `input_tokens` / `output_tokens`, in the body or, when
streamed, in the final `response.completed` (or `response.incomplete`) event; it is never
stripped there.

For SSE the per-chunk work is a few C-level byte scans: where the last complete event ends,
how many `data:` fields and events went by (the tokens relayed so far, for a stream cut
short; an event without data is not vLLM's SSE) and whether `"usage"` or `"error"` occurs.
Only events holding one of those are looked at closer: vLLM's usage chunk (`"choices":[]`
plus `"usage"`, right before `[DONE]`), read with a few regular expressions (no JSON objects
are built) and dropped when the client did not ask for usage, and an in-band error event.
A partial event is held back until its end arrives, so a dropped event never leaves half an
event behind.

JSON escapes every quote inside a string, so `"usage"` and `"error"` with their quotes can
only be keys or whole string values, never a piece of generated text.

Problems are recorded, never raised: `problem` names the first (`bad_json`, `bad_sse`) and
`inband_error` says the upstream sent `data: {"error": ...}` after its 200.
"""

from __future__ import annotations

import json
import re
from typing import NamedTuple

# A partial event larger than this is not SSE as vLLM writes it: relay it raw.
MAX_PENDING = 256 * 1024
# Non-SSE streamed bodies keep this much of their end, where usage sits.
TAIL_BYTES = 8 * 1024
_SEPARATOR = re.compile(rb"\r?\n\r?\n")
_FIELDS = (b"data:", b":", b"event:", b"id:", b"retry:")
# `"usage": {...}` with at most one level of nested objects (prompt_tokens_details). Usage is
# read with these instead of parsing JSON: a few regex steps per response, no objects built.
_USAGE = re.compile(rb'"usage"\s*:\s*(\{[^{}]*(?:\{[^{}]*\}[^{}]*)*\})')
_NO_USAGE = re.compile(rb'"usage"\s*:\s*null')
# Chat and completions say prompt/completion tokens; the Responses API input/output tokens.
_PROMPT_TOKENS = re.compile(rb'"(?:prompt|input)_tokens"\s*:\s*(\d+)')
_COMPLETION_TOKENS = re.compile(rb'"(?:completion|output)_tokens"\s*:\s*(\d+)')
_NO_CHOICES = re.compile(rb'"choices"\s*:\s*\[\s*\]')
# vLLM's per-chunk usage right after a non-empty choices array (the final usage chunk's
# choices are empty): `}],"usage":{...}` as its compact JSON writes it.
_RUNNING_AT = b'}],"usage":{'


class Usage(NamedTuple):
    prompt_tokens: int
    completion_tokens: int


def usage_in(text: bytes) -> Usage | None:
    """The counts of a JSON usage object's text, e.g. `{"prompt_tokens":9,...}`."""
    prompt, completion = _PROMPT_TOKENS.search(text), _COMPLETION_TOKENS.search(text)
    if prompt is None or completion is None:
        return None
    return Usage(int(prompt.group(1)), int(completion.group(1)))


class ResponseMeter:
    __slots__ = (
        "_pending",
        "_running",
        "_tail",
        "events",
        "inband_error",
        "problem",
        "running",
        "strip_running",
        "strip_usage",
        "tokens_per_event",
        "usage",
    )

    def __init__(
        self,
        *,
        strip_usage: bool,
        running: bool = False,
        strip_running: bool = False,
        tokens_per_event: int = 1,
    ) -> None:
        self.strip_usage = strip_usage
        """Drop the final usage chunk (the client did not ask for it)."""
        self.running = running
        """Chunks carry running usage (a chat or completion stream that asked for it); the
        final usage is then only the chunk without choices. The Responses API has none."""
        self.strip_running = strip_running
        """Cut the usage out of every other chunk (the client did not ask for that)."""
        self.tokens_per_event = tokens_per_event
        """The most tokens vLLM puts in one event of this stream when its reader keeps up
        (the stream_interval the gateway asked for)."""
        self.usage: Usage | None = None
        """The final usage (chunk), or the usage of a whole body."""
        self.events = 0
        self.inband_error = False
        self.problem: str | None = None
        self._pending = b""
        self._running = b""
        self._tail = b""

    @property
    def running_usage(self) -> Usage | None:
        """vLLM's count at the last chunk that carried one (per choice: with n > 1 each
        chunk counts its own choice's tokens)."""
        return usage_in(self._running) if self._running else None

    def streamed_tokens(self, choices: int) -> int:
        """Completion tokens of a stream cut short, never below what vLLM made of it as far
        as the gateway read: vLLM's running count, or `tokens_per_event` per event without
        one. With n > 1 the count is one choice's, and the others' events for the same step
        may still be on their way: (count + tokens_per_event) per choice."""
        running = self.running_usage
        per_event = self.tokens_per_event
        if running is None:
            return self.events * per_event
        if choices == 1:
            return running.completion_tokens
        return max(self.events, (running.completion_tokens + per_event) * choices)

    # -- whole bodies ----------------------------------------------------------------------

    def read_json(self, body: bytes) -> None:
        """Usage from a whole JSON body: only its `"usage"` object is parsed (vLLM writes it
        after the choices), not the whole body."""
        at = body.rfind(b'"usage"')
        match = _USAGE.match(body, at) if at >= 0 else None
        if match is None:
            if not body.lstrip().startswith(b"{"):
                self._problem("bad_json")
            return
        self.usage = usage_in(match.group(1))

    # -- streamed bodies that are not SSE: only their end is kept ------------------------

    def feed_other(self, chunk: bytes) -> None:
        self._tail = (self._tail + chunk)[-TAIL_BYTES:]

    def end_other(self) -> None:
        self.read_json(self._tail)

    # -- SSE -------------------------------------------------------------------------------

    def feed(self, chunk: bytes) -> bytes:
        """The complete events of what arrived so far, less a stripped usage event."""
        if not self._pending and chunk.endswith(b"\n\n") and chunk.startswith(b"data:"):
            # The common case, one or more whole events (vLLM writes one per chunk).
            fields = chunk.count(b"data:")
            self.events += fields
            if fields < chunk.count(b"\n\n"):
                self._problem("bad_sse")
            if self.running:
                chunk = self._take_running(chunk)
            if b'"usage"' in chunk or b'"error"' in chunk:
                return self._inspect(chunk)
            return chunk
        data = self._pending + chunk if self._pending else chunk
        if data.endswith(b"\n\n"):
            end = len(data)
        else:
            lf, crlf = data.rfind(b"\n\n"), data.rfind(b"\r\n\r\n")
            end = max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)
            if end == 0:
                if len(data) > MAX_PENDING:
                    self._problem("bad_sse")
                    self._pending = b""
                    return data
                self._pending = data
                return b""
        if end == len(data):
            complete, self._pending = data, b""
        else:
            complete, self._pending = data[:end], data[end:]
        fields = complete.count(b"data:")
        self.events += fields
        # Every event vLLM sends has a data field: fewer fields than events is not its SSE.
        if fields < complete.count(b"\n\n") or not complete.startswith(_FIELDS):
            self._problem("bad_sse")
        if self.running:
            complete = self._take_running(complete)
        if b'"usage"' in complete or b'"error"' in complete:
            return self._inspect(complete)
        return complete

    def end(self) -> bytes:
        """What is still held back when the stream ends (an event without its blank line)."""
        rest, self._pending = self._pending, b""
        if not rest:
            return b""
        self.events += rest.count(b"data:")
        self._problem("bad_sse")
        if b'"usage"' in rest or b'"error"' in rest:
            return self._inspect(rest)
        return rest

    def discard_pending(self) -> None:
        """Forget a partial event (the stream failed; half an event must not be relayed)."""
        self._pending = b""

    def _take_running(self, block: bytes) -> bytes:
        """Keep the last per-chunk usage of `block` (if any); cut them all out unless asked for.

        A few C-level scans per event (a usage object nests at most one level, as `_USAGE`
        reads), no regex: under load the upstream's events arrive several to a read, and a
        regex with a look-behind over such a block cost a fifth of the gateway's streams."""
        pieces: list[bytes] = []
        start = 0
        found = b""
        at = block.find(_RUNNING_AT)
        while at >= 0:
            comma = at + 2  # after `}]`
            brace = comma + len(b',"usage":')
            end = block.find(b"}", brace)
            if end < 0:
                break
            if block.find(b"{", brace + 1, end) >= 0:  # a nested object closes first
                end = block.find(b"}", end + 1)
                if end < 0:
                    break
            found = block[brace : end + 1]
            pieces.append(block[start:comma])
            start = end + 1
            at = block.find(_RUNNING_AT, start)
        if not found:
            return block
        self._running = found
        if not self.strip_running:
            return block
        pieces.append(block[start:])
        return b"".join(pieces)

    def _inspect(self, block: bytes) -> bytes:
        if block.count(b"\n") == 2 and block.endswith(b"\n\n"):  # one event, one line
            return b"" if self._read_event(block) else block
        kept: list[bytes] = []
        dropped = False
        events = _SEPARATOR.split(block) if b"\r" in block else block.split(b"\n\n")
        for event in events:
            if not event:
                continue
            if (b'"usage"' in event or b'"error"' in event) and self._read_event(event):
                dropped = True
                continue
            kept.append(event)
        if not dropped:
            return block
        separator = b"\r\n\r\n" if b"\r\n\r\n" in block else b"\n\n"
        return b"".join(event + separator for event in kept)

    def _read_event(self, event: bytes) -> bool:
        """Record usage or an error from one event; True if the event is to be dropped."""
        if b"\n" in event.rstrip():
            payload = b"\n".join(
                line[5:] for line in event.splitlines() if line.startswith(b"data:")
            ).strip()
        else:
            payload = event[5:].strip() if event.startswith(b"data:") else b""
        if not payload or payload == b"[DONE]":
            return False
        if b'"error"' in payload:
            self._read_error(payload)
        if b'"usage"' not in payload:
            return False
        match = _USAGE.search(payload)
        if match is None:
            if _NO_USAGE.search(payload) is None:
                self._problem("bad_json")
            return False
        usage = usage_in(match.group(1))
        if usage is None:
            self._problem("bad_json")
            return False
        final = _NO_CHOICES.search(payload) is not None
        if self.running and not final:
            return False  # a chunk's running usage (`_take_running` kept it)
        self.usage = usage
        return self.strip_usage and final

    def _read_error(self, payload: bytes) -> None:
        """An in-band error is an event whose JSON object has a top-level `error` (rare:
        parsed in full)."""
        try:
            data = json.loads(payload)
        except (ValueError, RecursionError):
            self._problem("bad_json")
            return
        if isinstance(data, dict) and "error" in data:
            self.inband_error = True

    def _problem(self, kind: str) -> None:
        if self.problem is None:
            self.problem = kind
