"""Prefix affinity: send a request to the engine that already holds the longest part of its
prompt in vLLM's prefix cache, the engine its conversation used so far (docs/scale-out.md).

    table = PrefixTable(capacity=200_000)
    hashes = prefix_hashes(prompt_text(kind, data))
    engine = table.longest_match(hashes, eligible)   # an engine id in `eligible`, or None
    table.remember(hashes, engine_id)

Rules:
- the prompt is cut into `CHUNK_CHARS` pieces whose hashes are chained, so one hash stands
  for a whole prefix; only where a prompt ended (a tip) names an engine (`PrefixTable`);
- the table is per gateway replica and approximate: a wrong guess costs a cache miss, never a
  wrong answer;
- hashes are Python's keyed `hash` (random per process: clients cannot aim collisions), the
  table holds no prompt text, and past `capacity` entries the older half is dropped.
"""

from __future__ import annotations

import json
from collections.abc import Container, Sequence
from typing import Any

# About 16 tokens of English text, vLLM's KV block: finer would track blocks vLLM cannot
# reuse anyway, coarser would miss the start of short conversations.
CHUNK_CHARS = 64
# Message boundaries in the flattened chat text: ASCII record/unit separators, which chat
# content practically never contains, so "ab"+"c" and "a"+"bc" flatten differently.
_UNIT = "\x1f"
_RECORD = "\x1e"


def prompt_text(kind: str, data: dict[str, Any]) -> str | None:
    """The request's prompt as one string whose prefixes grow with the conversation, or None
    when there is nothing to key on (a batch of prompts, token ids)."""
    if kind == "chat":
        messages = data.get("messages")
        if not isinstance(messages, list):
            return None
        parts: list[str] = []
        for message in messages:
            if not isinstance(message, dict):
                return None
            content = message.get("content")
            if isinstance(content, str) and len(message) <= 2:
                parts.append(f"{message.get('role')}{_UNIT}{content}{_RECORD}")
            else:  # content parts, tool calls, names: the whole message, canonical
                parts.append(json.dumps(message, sort_keys=True, separators=(",", ":")) + _RECORD)
        return "".join(parts)
    if kind == "responses":
        instructions, given = data.get("instructions"), data.get("input")
        if isinstance(given, str) and instructions is None:
            return given
        return json.dumps([instructions, given], sort_keys=True, separators=(",", ":"))
    if kind == "messages":  # the system prompt, then the turns: the JSON grows at its end
        turns = [data.get("system"), data.get("messages")]
        return json.dumps(turns, sort_keys=True, separators=(",", ":"))
    prompt = data.get("prompt")
    return prompt if isinstance(prompt, str) else None


def prefix_hashes(text: str) -> list[int]:
    """One chained hash per whole `CHUNK_CHARS` piece of `text` (a partial last piece is
    left out: the next turn extends it, so it would never match)."""
    hashes: list[int] = []
    chain = 0
    for start in range(0, len(text) - CHUNK_CHARS + 1, CHUNK_CHARS):
        chain = hash((chain, text[start : start + CHUNK_CHARS]))
        hashes.append(chain)
    return hashes


class PrefixTable:
    """Prefix hash -> the engine that last served a prompt with that prefix, and whether a
    prompt ended there (a tip).

    Only a tip names an engine: turn N+1's deepest known prefix is turn N's tip, so the
    conversation stays; a new conversation that shares only a system prompt with others
    matches an interior prefix, names none, and is balanced like any new request (every
    engine caches a shared system prompt after its first use of it anyway).
    """

    def __init__(self, capacity: int = 200_000) -> None:
        # value: engine id << 1 | 1 for a tip
        self._entries: dict[int, int] = {}
        self._capacity = capacity

    def __len__(self) -> int:
        return len(self._entries)

    def longest_match(self, hashes: Sequence[int], eligible: Container[int]) -> int | None:
        """The engine whose tip is the deepest known prefix of `hashes`, if it is among the
        `eligible` engine ids; else None."""
        entries = self._entries
        for chain in reversed(hashes):
            entry = entries.get(chain)
            if entry is None:
                continue
            engine = entry >> 1
            if entry & 1 and engine in eligible:
                return engine
            return None
        return None

    def remember(self, hashes: Sequence[int], engine: int) -> None:
        """`engine` now holds every prefix in `hashes` (most recent wins); the last is a tip."""
        entries = self._entries
        last = len(hashes) - 1
        for position, chain in enumerate(hashes):
            # popped so the entry moves to the young end of the (ordered) dict
            old = entries.pop(chain, None)
            tip = position == last or (old is not None and old == (engine << 1 | 1))
            entries[chain] = engine << 1 | tip
        if len(entries) > self._capacity:
            self._entries = dict(list(entries.items())[len(entries) // 2 :])

    def forget_engine(self, engine: int) -> None:
        """Drop what `engine` held (it restarted: its cache is empty)."""
        self._entries = {
            chain: entry for chain, entry in self._entries.items() if entry >> 1 != engine
        }
