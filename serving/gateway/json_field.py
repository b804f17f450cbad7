"""One field of a JSON object's top level, read from the object's text as it streams past:
how a pooling answer's `usage` is found in a body too large to hold whole (an embeddings
batch can be tens of megabytes of floats).

    field = TopLevelField(b"usage")
    for chunk in body:
        field.feed(chunk)
    field.value()      # the field's parsed value; None: absent, too long, or not an object

Rules:
- the text is followed as JSON is tokenized (strings with their escapes, nesting), so the
  field is a key of the top-level object only, never text inside a string or a nested
  object: a rerank answer echoes documents a client wrote, usage-shaped text included;
- memory stays small: only the key being read and the field's value (up to `limit` bytes);
- the scan jumps between the bytes that matter (quotes; brackets; commas and colons at the
  top level) with C-level searches, so long arrays and strings cost little Python time;
- it locates the field, it does not validate the rest of the document: its value is parsed
  with `json.loads`, and anything that is not one object with the field gives None.
"""

from __future__ import annotations

import json
import re

# Outside strings: what changes the nesting, or starts a string. At the top level, also
# what ends a value (`,`) or a key (`:`).
_NESTED = re.compile(rb'["\[\]{}]')
_TOP = re.compile(rb'["\[\]{},:]')
_QUOTE, _BACKSLASH = 0x22, 0x5C
_OPEN, _CLOSE = frozenset(b"{["), frozenset(b"}]")
# A top-level key longer than this is not the one looked for (it is skipped, not kept).
_MAX_KEY = 256


class TopLevelField:
    __slots__ = (
        "_capture",
        "_depth",
        "_ended",
        "_escaped",
        "_expect_key",
        "_found",
        "_in_string",
        "_key",
        "_limit",
        "_name",
        "_pending",
        "broken",
    )

    def __init__(self, name: bytes, *, limit: int = 4096) -> None:
        self._name = name.decode()
        self._limit = limit
        self._depth = 0
        self._in_string = False
        self._escaped = False
        """The first byte of the next chunk is escaped (a string's text ended in `\\`)."""
        self._expect_key = False
        self._key: bytearray | None = None
        """The top-level key being read, without its quotes."""
        self._pending: str | None = None
        """The last top-level key read, until its colon."""
        self._capture: bytearray | None = None
        self._found: bytes | None = None
        self._ended = False
        self.broken = False
        """The text is not a JSON object as far as was read."""

    @property
    def complete(self) -> bool:
        """The text read so far is one whole JSON object, as far as its structure goes."""
        return self._ended and not self.broken

    def value(self) -> object:
        """The field's value once the object has ended; None otherwise."""
        if not self.complete or self._found is None:
            return None
        try:
            return json.loads(self._found)
        except ValueError:
            return None

    def feed(self, chunk: bytes) -> None:
        pos, size = 0, len(chunk)
        while pos < size and not self.broken:
            if self._in_string:
                pos = self._string(chunk, pos, size)
                continue
            search = _TOP if self._depth == 1 else _NESTED
            match = search.search(chunk, pos)
            at = size if match is None else match.start()
            if at > pos:
                self._take(chunk[pos:at])
            if match is None:
                return
            self._structural(chunk[at])
            pos = at + 1

    def _string(self, chunk: bytes, pos: int, size: int) -> int:
        """Read string text from `pos`: the position after its closing quote, or `size`."""
        if self._escaped:  # the byte the previous chunk's backslash escapes
            self._escaped = False
            self._take(chunk[pos : pos + 1])
            pos += 1
        start = pos
        while True:
            at = chunk.find(b'"', pos, size)
            if at < 0:
                self._escaped = _odd_backslashes(chunk, start, size)
                self._take(chunk[start:size])
                return size
            if _odd_backslashes(chunk, start, at):  # an escaped quote: part of the text
                pos = at + 1
                continue
            self._take(chunk[start:at])
            self._in_string = False
            if self._key is not None:
                self._end_key()
            elif self._capture is not None:
                self._capture.append(_QUOTE)
            return at + 1

    def _structural(self, byte: int) -> None:
        depth = self._depth
        if self._ended:
            self.broken = True  # text after the object
        elif byte == _QUOTE:
            self._in_string = True
            if depth == 1 and self._expect_key:
                self._expect_key = False
                self._key = bytearray()
            elif depth == 0:
                self.broken = True
            else:
                self._take(b'"')
        elif byte in _OPEN:
            if depth == 0:
                self.broken = byte != 0x7B  # `{`: the top-level object starts
                self._expect_key = True
            else:
                self._take(bytes((byte,)))
            self._depth = depth + 1
        elif byte in _CLOSE:
            if depth == 1:
                self._end_value()
                self._ended = True
                self.broken = byte != 0x7D  # `]` cannot close an object
            elif depth == 0:
                self.broken = True
            else:
                self._take(bytes((byte,)))
            self._depth = depth - 1
        elif byte == 0x2C:  # `,` at the top level: the next key follows
            self._end_value()
            self._expect_key = True
        else:  # `:` at the top level: the value of the key just read follows
            if self._pending == self._name:
                self._capture = bytearray()
            self._pending = None

    def _take(self, piece: bytes) -> None:
        if self._key is not None:
            if len(self._key) <= _MAX_KEY:
                self._key += piece[: _MAX_KEY + 1]
        elif self._capture is not None:
            self._capture += piece
            if len(self._capture) > self._limit:
                self._capture = None

    def _end_key(self) -> None:
        raw, self._key = bytes(self._key or b""), None
        if len(raw) > _MAX_KEY:
            self._pending = None
            return
        try:
            self._pending = json.loads(b'"' + raw + b'"') if _BACKSLASH in raw else raw.decode()
        except ValueError:
            self.broken = True

    def _end_value(self) -> None:
        if self._capture is not None:
            self._found = bytes(self._capture)  # the last one wins, as in json.loads
            self._capture = None


def _odd_backslashes(chunk: bytes, start: int, end: int) -> bool:
    """Whether an odd run of backslashes ends at `end` (not before `start`): the byte at
    `end` is escaped."""
    run = 0
    while end - run > start and chunk[end - run - 1] == _BACKSLASH:
        run += 1
    return run % 2 == 1
