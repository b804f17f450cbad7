"""What the Batch API's tests share: a store and contents in a temporary directory, a
clock the test moves, input files, a fake line executor (its runs' reservations and the
cut runs it was charged), and a batch run through a test gateway's HTTP API (`run_batch`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from serving.gateway.auth import Caller, Principal
from serving.gateway.batches.attempts import Attempt
from serving.gateway.batches.contents import FileContents
from serving.gateway.batches.line_call import LineResult
from serving.gateway.batches.metrics import LineOutcome
from serving.gateway.batches.objects import FileRow, new_id
from serving.gateway.batches.owners import Owners
from serving.gateway.batches.runner import BatchRunner
from serving.gateway.batches.store import BatchStore
from serving.gateway.batches.validation import BodyCheck
from serving.gateway.request_fields import Kind
from tests.gateway.conftest import eventually
from tests.gateway.servers import GatewayServer, http_client

CHAT = "/v1/chat/completions"


class Clock:
    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def line(custom_id: str, content: str | None = None, *, url: str = CHAT, model: str = "m") -> bytes:
    """A chat line whose message is `content` (default: its custom_id)."""
    message = {"role": "user", "content": content or custom_id}
    body = {"model": model, "messages": [message], "max_tokens": 4}
    item = {"custom_id": custom_id, "method": "POST", "url": url, "body": body}
    return json.dumps(item).encode()


def jsonl(*lines: bytes) -> bytes:
    return b"\n".join(lines) + b"\n"


def no_check(caller: Caller) -> BodyCheck:
    def check(kind: Kind, body: bytes) -> None:
        return None

    return check


RESERVED = ("m", 7, 4)
"""What `FakeEngine.reserve` says every line's run may cost: (model, prompt, completion)."""


@dataclass
class FakeEngine:
    """Answers each line with its `content` echoed; `answers` overrides by content. A line
    whose content is in `held` waits for that event before it answers."""

    answers: dict[str, list[LineResult]] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    request_ids: list[str] = field(default_factory=list)
    held: dict[str, asyncio.Event] = field(default_factory=dict)
    cuts_charged: list[Attempt] = field(default_factory=list)

    async def __call__(
        self, kind: Kind, caller: Caller, body: bytes, path: str, request_id: str
    ) -> LineResult:
        content = json.loads(body)["messages"][0]["content"]
        self.calls.append(content)
        self.request_ids.append(request_id)
        if content in self.held:
            await self.held[content].wait()
        queued = self.answers.get(content)
        if queued:
            return queued.pop(0)
        usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
        answer = {"object": "chat.completion", "content": content, "usage": usage}
        return LineResult(200, json.dumps(answer).encode(), request_id)

    def reserve(self, kind: Kind, caller: Caller, body: bytes) -> tuple[str, int, int]:
        return RESERVED

    async def charge_cut(self, attempt: Attempt) -> None:
        self.cuts_charged.append(attempt)


@dataclass
class Setup:
    store: BatchStore
    contents: FileContents
    owners: Owners
    clock: Clock
    engine: FakeEngine

    def runner(
        self, *, concurrency: int = 2, count_line: Callable[[LineOutcome], None] | None = None
    ) -> BatchRunner:
        return BatchRunner(
            self.store,
            self.contents,
            self.owners,
            execute=self.engine,
            reserve=self.engine.reserve,
            charge_cut=self.engine.charge_cut,
            check_for=no_check,
            concurrency=concurrency,
            max_lines=100,
            clock=self.clock,
            poll_s=0.01,
            count_line=count_line or (lambda outcome: None),
        )

    def upload(self, key: str, data: bytes) -> str:
        file_id = new_id("file-")
        self.contents.write(file_id, data)
        now = int(self.clock())
        self.store.add_file(FileRow(file_id, key, "in.jsonl", "batch", len(data), now, None))
        return file_id


def make_setup(tmp_path: Path, *callers: Caller) -> Setup:
    owners = Owners()
    for caller in callers or (Principal("k1"),):
        owners.remember(caller)
    return Setup(
        BatchStore(tmp_path / "batches.db"),
        FileContents(tmp_path / "files"),
        owners,
        Clock(),
        FakeEngine(),
    )


def run_batch(gateway: GatewayServer, secret: str, content: str) -> dict[str, Any]:
    """One batch of two chat lines whose message is `content`, polled until it ended."""
    data = jsonl(*(line(f"c{n}", content, model="fake") for n in range(2)))
    with http_client(gateway.url, key=secret) as http:
        uploaded = http.post(
            "/v1/files", files={"file": ("in.jsonl", data)}, data={"purpose": "batch"}
        )
        assert uploaded.status_code == 200, uploaded.text
        created = http.post(
            "/v1/batches",
            json={
                "input_file_id": uploaded.json()["id"],
                "endpoint": CHAT,
                "completion_window": "24h",
            },
        )
        assert created.status_code == 200, created.text
        path = f"/v1/batches/{created.json()['id']}"
        assert eventually(lambda: http.get(path).json()["status"] == "completed", timeout=20)
        batch: dict[str, Any] = http.get(path).json()
    return batch
