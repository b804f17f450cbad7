"""The shared-prefix workload: multi-turn conversations behind one long system prompt.

    shape = Shape(conversations=8, turns=6)
    convs = conversations(shape, salt="router-ca")   # deterministic for a shape and salt
    outcome = await run_workload(target, convs, concurrency=4, seed=1)

Every conversation starts with the same long system prompt (the part all users share), then
grows by one user message and one canned assistant reply per turn, and each turn sends the
whole history so far: what a chat client sends. Turns are interleaved across conversations
in rounds (every conversation's turn t before any turn t+1), the conversations of a round in
a shuffled order, a few in flight at once. The shuffle matters: with the same order every
round, round-robin over two engines sends conversation c to engine c % len(engines) every
time when the number of conversations is even, and so would look as cache-friendly as
affinity by accident.

The assistant replies in the history are canned rather than what the model said, so every
path sends byte-identical prompts; the prefix cache only ever matches prompt blocks anyway
(a reply the engine generated is re-sent as part of the next prompt either way).

Each conversation also names itself in an `x-session-id` header, as a client that tracks its
sessions would: the one hint vllm-router's `consistent_hash` policy routes chats by (its
`cache_aware` matches prefixes of token ids only, which OpenAI chat requests do not carry).
Paths that do not use the header ignore it.

`salt` goes in the first line of the system prompt: paths measured one after another then
share no prefix at all, so nothing one path left in an engine's cache can hit for the next.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import aiohttp

from bench.gateway_overhead.load import Target
from serving.models.tiny_tokenizer import corpus_files

# Sizes in characters; the tiny model's tokenizer makes ~3 characters a token, so the system
# prompt is ~700 tokens (five and a half of vLLM's 128-token CPU blocks) and a turn ~150.
SYSTEM_CHARS = 2100
USER_CHARS = 180
REPLY_CHARS = 270
MAX_TOKENS = 4
"""Tokens generated per request: the hit rate is about prompts; decoding is kept short."""
REQUEST_TIMEOUT_S = 300.0
SESSION_HEADER = "x-session-id"


@dataclass(frozen=True, kw_only=True)
class Shape:
    conversations: int
    turns: int
    concurrency: int = 4
    """Requests in flight at once (within a round)."""
    seed: int = 20261201

    def describe(self) -> dict[str, int]:
        return {
            "conversations": self.conversations,
            "turns": self.turns,
            "requests": self.conversations * self.turns,
            "concurrency": self.concurrency,
            "seed": self.seed,
            "max_tokens": MAX_TOKENS,
        }


@dataclass(frozen=True)
class Conversation:
    session: str
    """Sent as `x-session-id`, the header vllm-router's consistent_hash policy keys on."""
    system: str
    users: Sequence[str]
    replies: Sequence[str]

    def messages(self, turn: int) -> list[dict[str, str]]:
        """The request of turn `turn` (0-based): the history so far and the new question."""
        messages = [{"role": "system", "content": self.system}]
        for earlier in range(turn):
            messages.append({"role": "user", "content": self.users[earlier]})
            messages.append({"role": "assistant", "content": self.replies[earlier]})
        messages.append({"role": "user", "content": self.users[turn]})
        return messages


@dataclass
class Outcome:
    """What one path did with the workload, as the client saw it."""

    ok: int = 0
    errors: int = 0
    first_error: str = ""
    prompt_tokens: list[int] = field(default_factory=list)
    latencies_s: list[float] = field(default_factory=list)
    wall_s: float = 0.0

    def fail(self, reason: str) -> None:
        self.errors += 1
        if not self.first_error:
            self.first_error = reason[:300]


def _sentences() -> list[str]:
    text = " ".join(path.read_text(encoding="utf-8") for path in corpus_files())
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if len(s.strip()) > 20]


def _take(sentences: Sequence[str], start: int, chars: int) -> str:
    """Sentences from `start` on (wrapping) until `chars` characters are reached."""
    out: list[str] = []
    size = 0
    index = start
    while size < chars:
        sentence = sentences[index % len(sentences)]
        out.append(sentence)
        size += len(sentence) + 1
        index += 1
    return " ".join(out)


def conversations(shape: Shape, *, salt: str) -> list[Conversation]:
    sentences = _sentences()
    rng = random.Random(shape.seed)
    system = f"Session {salt}. You are the assistant of a small company. " + _take(
        sentences, 0, SYSTEM_CHARS
    )
    out = []
    for index in range(shape.conversations):
        users = [
            _take(sentences, rng.randrange(len(sentences)), USER_CHARS) for _ in range(shape.turns)
        ]
        replies = [
            _take(sentences, rng.randrange(len(sentences)), REPLY_CHARS) for _ in range(shape.turns)
        ]
        session = f"{salt}-{index}"
        out.append(Conversation(session=session, system=system, users=users, replies=replies))
    return out


async def run_workload(
    target: Target, convs: Sequence[Conversation], *, concurrency: int, seed: int
) -> Outcome:
    """Send every turn of every conversation, round by round (see the module docstring)."""
    outcome = Outcome()
    rng = random.Random(seed)
    gate = asyncio.Semaphore(concurrency)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    turns = min(len(c.users) for c in convs)
    started = time.perf_counter()
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def send(conv: Conversation, turn: int) -> None:
            body = {
                "model": target.model,
                "messages": conv.messages(turn),
                "max_tokens": MAX_TOKENS,
                "temperature": 0,
            }
            headers = {**target.headers(), SESSION_HEADER: conv.session}
            async with gate:
                await _one(session, target, body, headers, outcome)

        for turn in range(turns):
            order = list(convs)
            rng.shuffle(order)
            # Started in this order: a task takes the semaphore in the order it was created.
            await asyncio.gather(*(send(conv, turn) for conv in order))
    outcome.wall_s = time.perf_counter() - started
    return outcome


async def _one(
    session: aiohttp.ClientSession,
    target: Target,
    body: dict[str, object],
    headers: dict[str, str],
    outcome: Outcome,
) -> None:
    start = time.perf_counter()
    try:
        async with session.post(target.url, json=body, headers=headers) as response:
            raw = await response.read()
            status = response.status
    except (aiohttp.ClientError, TimeoutError) as exc:
        outcome.fail(f"{type(exc).__name__}: {exc}")
        return
    if status != 200:
        outcome.fail(f"HTTP {status}: {raw[:200]!r}")
        return
    try:
        answer = json.loads(raw)
        prompt_tokens = int(answer["usage"]["prompt_tokens"])
        answer["choices"][0]["message"]
    except (ValueError, KeyError, IndexError, TypeError):
        outcome.fail(f"bad completion: {raw[:200]!r}")
        return
    outcome.ok += 1
    outcome.prompt_tokens.append(prompt_tokens)
    outcome.latencies_s.append(time.perf_counter() - start)
