"""Reading vLLM's reported usage from a response as it is relayed (docs/gateway.md, charging
rules).

    meter = ResponseMeter(strip_usage=True)          # chat / completions
    meter = ResponseMeter(strip_usage=False, responses=True)   # the Responses API
    meter = ResponseMeter(strip_usage=False, messages=True)    # Anthropic Messages
    meter = ResponseMeter(strip_usage=False, pooling=True)     # embeddings, score, rerank
    meter.read_json(body)                  # a whole JSON body
    out = meter.feed(chunk) ... meter.end()  # an SSE stream: returns the bytes to relay

Rules:
- the final usage is read only from the parsed JSON of the one place its protocol puts it
  (vLLM's Responses events echo request fields a client could fill with usage-shaped text;
  a Messages stream's events are read by their `type`, `anthropic_events`; a pooling
  answer too large to keep whole is scanned for its top-level `usage`, `json_field`);
- per-chunk usage (`continuous_usage_stats`) is found right after `}],"usage":{`, bytes that
  cannot occur inside a JSON string; the last one is `running_usage`, and they are cut out
  unless the client asked for them;
- only events holding `"usage"` or `"error"` are parsed; a partial event is held back until
  its end arrives;
- problems are recorded (`problem`, `inband_error`), never raised.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from serving.gateway.anthropic_events import event_usage, generated_bytes, message_usage
from serving.gateway.json_field import TopLevelField
from serving.gateway.sse import event_data, json_value
from serving.vllm_limits import DEFAULT_STREAM_INTERVAL

# A partial event larger than this is not SSE as vLLM writes it: relay it raw.
MAX_PENDING = 256 * 1024
# A streamed body that is not SSE is kept up to this size to be parsed whole at its end;
# past it the usage is unknown (the request is charged its reservation).
MAX_OTHER_BODY = 16 * 1024 * 1024
_SEPARATOR = re.compile(rb"\r?\n\r?\n")
_FIELDS = (b"data:", b":", b"event:", b"id:", b"retry:")
# vLLM's per-chunk usage right after a non-empty choices array (the final usage chunk's
# choices are empty): `}],"usage":{` as its compact JSON writes it.
_RUNNING_AT = b'}],"usage":{'
_USAGE_OFFSET = len(b'}],"usage":')
# A chat or completion stream's final usage chunk has `"choices":[]`: only such events are
# parsed while every chunk carries running usage (the parse then decides).
_NO_CHOICES = re.compile(rb'"choices"\s*:\s*\[\s*\]')
# The Responses events that carry the response's final usage.
_FINAL_RESPONSE_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})
_CHAT_FIELDS = ("prompt_tokens", "completion_tokens")
# What the accounting oracle allows each sequence of a request charged by a bound (no final
# usage): tokens vLLM may generate between the gateway's last read and the abort its closing
# causes. Measured on cpu-tiny with a slow reader (tests/integration/test_cut_streams.py):
# at most 7 tokens short a sequence; the rest is margin for a busy machine. The service
# tier's oracle and the ChargesBelowEngineCount alert both use it.
CUT_SLACK_TOKENS = 64
# Generated tokens a Responses stream may hold that no delta shows (reasoning markers, EOS).
TEXTLESS_TOKENS = 4
# The `type` of every Responses event that carries generated text ends so.
_DELTA_TYPE_END = b'.delta"'
_RESPONSES_FIELDS = ("input_tokens", "output_tokens")


class Usage(NamedTuple):
    prompt_tokens: int
    completion_tokens: int


def usage_of(value: object, *, responses: bool = False) -> Usage | None:
    """The counts of a parsed usage object (None: not one, or counts that are not counts)."""
    if not isinstance(value, dict):
        return None
    prompt_name, completion_name = _RESPONSES_FIELDS if responses else _CHAT_FIELDS
    prompt, completion = value.get(prompt_name), value.get(completion_name)
    if type(prompt) is not int or type(completion) is not int or prompt < 0 or completion < 0:
        return None
    return Usage(prompt, completion)


def pooling_usage(value: object) -> Usage | None:
    """The counts of a pooling answer's usage object: `prompt_tokens` and `total_tokens` (a
    rerank answer has no `completion_tokens`); a total beyond the prompt is charged as
    generated (vLLM's pooling answers have none)."""
    if not isinstance(value, dict):
        return None
    prompt, total = value.get("prompt_tokens"), value.get("total_tokens")
    if type(prompt) is not int or type(total) is not int or not 0 <= prompt <= total:
        return None
    return Usage(prompt, total - prompt)


def _delta_bytes(event: bytes) -> int:
    """The UTF-8 bytes of a Responses delta event's `delta` text (0 when it has none)."""
    data = json_value(event_data(event))
    delta = data.get("delta") if isinstance(data, dict) else None
    return len(delta.encode()) if isinstance(delta, str) else 0


class ResponseMeter:
    __slots__ = (
        "_field",
        "_last_chunk_usage",
        "_other",
        "_other_size",
        "_pending",
        "chunk_usage",
        "delta_bytes",
        "events",
        "inband_error",
        "messages",
        "overtaken",
        "pooling",
        "problem",
        "responses",
        "start_usage",
        "strip_chunk_usage",
        "strip_usage",
        "tokens_per_event",
        "usage",
    )

    def __init__(
        self,
        *,
        strip_usage: bool,
        chunk_usage: bool = False,
        strip_chunk_usage: bool = False,
        tokens_per_event: int = DEFAULT_STREAM_INTERVAL,
        responses: bool = False,
        messages: bool = False,
        pooling: bool = False,
    ) -> None:
        self.strip_usage = strip_usage
        """Drop the final usage chunk (the client did not ask for it)."""
        self.chunk_usage = chunk_usage
        """Chunks carry running usage (a chat or completion stream that asked for it); the
        final usage is then only the chunk without choices. The Responses API has none."""
        self.strip_chunk_usage = strip_chunk_usage
        """Cut the usage out of every other chunk (the client did not ask for that)."""
        self.tokens_per_event = tokens_per_event
        """The most tokens vLLM puts in one event of this stream when its reader keeps up
        (the stream_interval the gateway asked for)."""
        self.responses = responses
        """The Responses API: usage as input/output tokens, at `response.usage` in a
        stream's final event; never stripped."""
        self.messages = messages
        """Anthropic Messages: usage as input (with the cache fields) and output tokens, in
        a stream's `message_start` and `message_delta` events; never stripped."""
        self.pooling = pooling
        """A pooling route (embeddings, score, rerank): one JSON answer whose top-level
        `usage` has prompt and total tokens; never stripped."""
        self.usage: Usage | None = None
        """The final usage (chunk), or the usage of a whole body."""
        self.events = 0
        self.delta_bytes = 0
        """Responses and Messages streams: UTF-8 bytes of the text their deltas carried."""
        self.start_usage: Usage | None = None
        """A Messages stream's prompt as vLLM counted it (`message_start`)."""
        self.inband_error = False
        self.overtaken = False
        """vLLM went on past what was read, and the gateway let go before it caught up (a
        client that stopped reading went away): what it generated is unknown."""
        self.problem: str | None = None
        self._pending = b""
        self._last_chunk_usage = b""
        self._other: list[bytes] = []
        self._other_size = 0
        self._field = TopLevelField(b"usage") if pooling else None

    @property
    def running_usage(self) -> Usage | None:
        """vLLM's count at the last chunk that carried one (per choice: with n > 1 each
        chunk counts its own choice's tokens)."""
        return usage_of(json_value(self._last_chunk_usage)) if self._last_chunk_usage else None

    def streamed_tokens(self, choices: int) -> int | None:
        """Completion tokens of a stream cut short, never below what vLLM made of it as far
        as the gateway read: vLLM's running count, or `tokens_per_event` per event without
        one. With n > 1 the count is one choice's, and the others' events for the same step
        may still be on their way: (count + tokens_per_event) per choice. None when the
        stream was `overtaken` (no count read bounds it)."""
        if self.overtaken:
            return None
        if self.responses or self.messages:
            # No running count, and vLLM merges several tokens into one delta for a reader
            # that fell behind: bound the tokens by the bytes of the deltas' text (a
            # byte-level BPE token is at least one byte of text), plus one per event and a
            # few for tokens with no text (`<think>`, EOS).
            return self.delta_bytes + self.events + TEXTLESS_TOKENS
        counted = self.running_usage
        per_event = self.tokens_per_event
        if counted is None:
            return self.events * per_event
        if choices == 1:
            return counted.completion_tokens
        return max(self.events, (counted.completion_tokens + per_event) * choices)

    # -- whole bodies ----------------------------------------------------------------------

    def read_json(self, body: bytes) -> None:
        """Usage from a whole JSON body: its top-level `usage`."""
        data = json_value(body)
        if not isinstance(data, dict):
            self._problem("bad_json")
            return
        usage = data.get("usage")
        if usage is not None:
            self.usage = self._usage_of(usage)
            if self.usage is None:
                self._problem("bad_json")

    def _usage_of(self, value: object) -> Usage | None:
        if self.messages:
            counts = message_usage(value)
            return None if counts is None else Usage(*counts)
        if self.pooling:
            return pooling_usage(value)
        return usage_of(value, responses=self.responses)

    # -- streamed bodies that are not SSE: kept whole (up to a limit), parsed at the end ---

    def feed_other(self, chunk: bytes) -> None:
        if self._field is not None:  # scanned as it passes, whatever its size
            self._field.feed(chunk)
        elif self._other_size <= MAX_OTHER_BODY:
            self._other.append(chunk)
            self._other_size += len(chunk)

    def end_other(self) -> None:
        if self._field is not None:  # as `read_json` does with a whole body
            found = self._field.value()
            if found is not None:
                self.usage = pooling_usage(found)
            if not self._field.complete or (found is not None and self.usage is None):
                self._problem("bad_json")
        elif self._other_size > MAX_OTHER_BODY:
            self._problem("bad_json")
        else:
            self.read_json(b"".join(self._other))
        self._other = []

    # -- SSE -------------------------------------------------------------------------------

    def feed(self, chunk: bytes) -> bytes:
        """The complete events of what arrived so far, less a stripped usage event."""
        if self.responses or self.messages:
            return self._feed_responses(chunk)
        if not self._pending and chunk.endswith(b"\n\n"):
            out = self._lines(chunk)
            if out is not None:
                return out
        return self._feed(chunk)

    def _feed(self, chunk: bytes) -> bytes:
        if not self._pending and chunk.endswith(b"\n\n") and chunk.startswith(b"data:"):
            # Whole events (several: a reader that fell behind gets them in one read).
            fields = chunk.count(b"data:")
            self.events += fields
            if fields < chunk.count(b"\n\n"):
                self._problem("bad_sse")
            if self.chunk_usage:
                chunk = self._take_chunk_usage(chunk)
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
        if self.chunk_usage:
            complete = self._take_chunk_usage(complete)
        if b'"usage"' in complete or b'"error"' in complete:
            return self._inspect(complete)
        return complete

    def _lines(self, block: bytes) -> bytes | None:
        """`_feed` for what vLLM sends: whole events of one `data:` line each (None: the
        block is not that; `_feed` then takes it whole). One forward pass, event by event,
        instead of `_feed`'s searches over the whole block: this runs on every chunk of every
        stream (its cost: docs/benchmarks.md).

        vLLM's running usage is the last field of its event, right after the choices, so
        an event holding one is neither the final usage chunk nor an error event and needs
        no other look; only the events without one are searched for `"usage"`/`"error"`.
        What this records before it gives up on a block (the final usage, an error) is
        recorded the same again by `_feed`."""
        strip = self.strip_chunk_usage
        running = self.chunk_usage
        pieces: list[bytes] = []
        keep = 0  # block[keep:] is still to be relayed
        found = (0, 0)  # the last running usage's span
        events = 0
        start, size = 0, len(block)
        while start < size:
            stop = block.find(b"\n", start)
            if block[stop + 1] != 0x0A or not block.startswith(b"data:", start):
                return None  # not one line ended by a blank line (`endswith` bounds `stop`)
            events += 1
            at = block.rfind(_RUNNING_AT, start, stop) if running else -1
            if at >= 0:
                brace = at + _USAGE_OFFSET
                end = block.find(b"}", brace, stop)
                last = stop - 2  # `}` closes the usage, then `}` the chunk
                if end != last and block.find(b"{", brace + 1, end) >= 0:
                    end = block.find(b"}", end + 1, stop)  # a nested object closed first
                if end != last or block[stop - 1] != 0x7D:
                    return None  # a field after it: not where vLLM puts it
                found = (brace, end + 1)
                if strip:
                    pieces.append(block[keep : at + 2])
                    keep = end + 1
            elif (
                block.find(b'"usage"', start, stop) >= 0 or block.find(b'"error"', start, stop) >= 0
            ) and self._read_event(block[start:stop]):
                pieces.append(block[keep:start])  # dropped: the usage chunk nobody asked for
                keep = stop + 2
            start = stop + 2
        self.events += events
        if found[1]:
            self._last_chunk_usage = block[found[0] : found[1]]
        if not pieces:
            return block
        pieces.append(block[keep:])
        return b"".join(pieces)

    def _feed_responses(self, chunk: bytes) -> bytes:
        """`feed` for a Responses or Messages stream; the generated text of its delta events
        is counted (UTF-8 bytes) for a cut stream's bound. A delta event is parsed as JSON:
        its `delta` is what vLLM generated, never the request echoed."""
        out = self._feed(chunk)
        if self.messages:
            self.delta_bytes += generated_bytes(out)
        elif _DELTA_TYPE_END in out:
            for event in out.split(b"\n\n"):
                if _DELTA_TYPE_END in event:
                    self.delta_bytes += _delta_bytes(event)
        return out

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

    def _take_chunk_usage(self, block: bytes) -> bytes:
        """Keep the last per-chunk usage of `block` (if any); cut them all out unless asked for.

        Byte scans, not a regex (a usage object nests at most one level): under load several
        events arrive per read, and a look-behind regex over such a block is costly."""
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
        self._last_chunk_usage = found
        if not self.strip_chunk_usage:
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
        payload = event_data(event)
        if not payload or payload == b"[DONE]":
            return False
        if self.chunk_usage and b'"error"' not in payload and not _NO_CHOICES.search(payload):
            return False  # a chunk's running usage (`_take_chunk_usage` kept it)
        data = json_value(payload)
        if not isinstance(data, dict):
            self._problem("bad_json")
            return False
        if "error" in data:
            self.inband_error = True
        if self.messages:
            return self._read_message_event(data)
        if self.responses:
            return self._read_response_event(data)
        if "usage" not in data or data.get("choices") != []:
            return False  # a chunk of the answer (its usage, if any, is a running count)
        if data["usage"] is None:
            return False
        usage = usage_of(data["usage"])
        if usage is None:
            self._problem("bad_json")
            return False
        self.usage = usage
        return self.strip_usage

    def _read_response_event(self, data: dict[str, Any]) -> bool:
        """A Responses event: its final one carries the usage at `response.usage`; every
        other usage-shaped object in it is the client's own request, echoed."""
        if data.get("type") not in _FINAL_RESPONSE_EVENTS:
            return False
        response = data.get("response")
        usage = response.get("usage") if isinstance(response, dict) else None
        if usage is None:
            return False
        self.usage = usage_of(usage, responses=True)
        if self.usage is None:
            self._problem("bad_json")
        return False

    def _read_message_event(self, data: dict[str, Any]) -> bool:
        """A Messages event: `message_start` carries the prompt's count, `message_delta` the
        final usage; any other event's usage-shaped text is content or the request."""
        found = event_usage(data)
        if found is None or found[1] is None:
            return False
        usage = self._usage_of(found[1])
        if usage is None:
            self._problem("bad_json")
        elif found[0] == "final":
            self.usage = usage
        elif usage.prompt_tokens > 0:  # vLLM writes 0 when its first chunk had no count
            self.start_usage = usage
        return False

    def _problem(self, kind: str) -> None:
        if self.problem is None:
            self.problem = kind
