"""The Batch API with the official `openai` client against real vLLM on the tiny model
(docs/batches.md): upload, create, poll, download; each line charged to its key as the
interactive request; another key's ids answered 404; cancel; expiry; a bad file fails with
its lines.
"""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Any, Final

import openai
import pytest
from openai.types import Batch

from serving.gateway.batches.store import DB_NAME
from tests.integration.conftest import MODEL, Stack
from tests.integration.test_gateway_quota import charged, client, create_key

ENDPOINT: Final = "/v1/chat/completions"
# Generous: a line waits behind every interactive request, on a shared 2-core machine.
BATCH_DEADLINE_S = 120


def _line(custom_id: str, body: dict[str, Any]) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": ENDPOINT, "body": body})


def _chat(content: str) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 8,
        "temperature": 0,
    }


def _submit(api: openai.OpenAI, lines: list[str]) -> Batch:
    uploaded = api.files.create(
        file=("input.jsonl", ("\n".join(lines) + "\n").encode()), purpose="batch"
    )
    assert uploaded.purpose == "batch" and uploaded.bytes > 0
    return api.batches.create(input_file_id=uploaded.id, endpoint=ENDPOINT, completion_window="24h")


def _wait(api: openai.OpenAI, batch_id: str, *ends: str) -> Batch:
    deadline = time.monotonic() + BATCH_DEADLINE_S
    while True:
        batch = api.batches.retrieve(batch_id)
        if batch.status in ends:
            return batch
        assert time.monotonic() < deadline, f"batch still {batch.status}: {batch}"
        time.sleep(0.5)


def _lines(api: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    assert file_id is not None
    return [json.loads(text) for text in api.files.content(file_id).text.splitlines()]


def _wait_completed(api: openai.OpenAI, batch_id: str, lines: int) -> None:
    deadline = time.monotonic() + BATCH_DEADLINE_S
    while (counts := api.batches.retrieve(batch_id).request_counts) is None or (
        counts.completed < lines
    ):
        assert time.monotonic() < deadline, f"{lines} lines did not finish"
        time.sleep(0.5)


def test_a_batch_runs_to_completed_charged_as_its_lines(stack: Stack) -> None:
    key_id, secret = create_key(stack, "batch-owner", "--rpm", "100", "--tpm", "100000")
    api = client(stack, secret)
    ids = ["weather", "story", "sum", "colour"]
    prompts = ["The weather?", "A story.", "2 + 2?", "A colour?"]
    batch = _submit(api, [_line(i, _chat(p)) for i, p in zip(ids, prompts, strict=True)])
    assert batch.status == "validating" and batch.endpoint == ENDPOINT

    done = _wait(api, batch.id, "completed", "failed", "expired", "cancelled")
    assert done.status == "completed", done
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed) == (4, 4)
    assert done.request_counts.failed == 0 and done.error_file_id is None
    assert done.in_progress_at and done.finalizing_at and done.completed_at

    outputs = _lines(api, done.output_file_id)
    assert sorted(line["custom_id"] for line in outputs) == sorted(ids)
    spent = 0
    for line in outputs:
        assert line["error"] is None and line["response"]["status_code"] == 200, line
        body = line["response"]["body"]
        assert body["object"] == "chat.completion" and body["model"] == MODEL
        assert 0 < body["usage"]["completion_tokens"] <= 8
        spent += body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"]
    assert charged(stack, key_id, "prompt") + charged(stack, key_id, "completion") == spent

    other = client(stack, create_key(stack, "batch-stranger")[1])
    for call in (
        lambda: other.files.retrieve(done.input_file_id),
        lambda: other.files.content(done.output_file_id or ""),
        lambda: other.batches.retrieve(done.id),
        lambda: other.batches.cancel(done.id),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    assert [listed.id for listed in other.batches.list()] == []
    assert done.id in [listed.id for listed in api.batches.list()]
    with pytest.raises(openai.BadRequestError):  # it ended
        api.batches.cancel(done.id)


def test_a_cancelled_batch_keeps_the_lines_done(stack: Stack) -> None:
    # Two requests a minute: two lines run, the others wait for the key's window.
    key_id, secret = create_key(stack, "batch-cancel", "--rpm", "2")
    api = client(stack, secret)
    lines = [_line(f"line-{n}", _chat(f"Count to {n}.")) for n in range(6)]
    batch = _submit(api, lines)
    _wait_completed(api, batch.id, 2)

    assert api.batches.cancel(batch.id).status in ("cancelling", "cancelled")
    done = _wait(api, batch.id, "cancelled")
    assert done.cancelling_at and done.cancelled_at
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed) == (6, 2)
    outputs = _lines(api, done.output_file_id)
    assert len(outputs) == 2 and all(line["response"]["status_code"] == 200 for line in outputs)
    spent = sum(
        line["response"]["body"]["usage"]["total_tokens"] for line in outputs
    )  # the lines refused by the key's rpm were charged nothing
    assert charged(stack, key_id, "prompt") + charged(stack, key_id, "completion") == spent


def test_a_batch_past_its_window_expires_keeping_the_lines_done(stack: Stack) -> None:
    # Two requests a minute: two lines run, the others wait for the key's window ...
    key_id, secret = create_key(stack, "batch-expiry", "--rpm", "2")
    api = client(stack, secret)
    ids = [f"line-{n}" for n in range(5)]
    batch = _submit(api, [_line(i, _chat(f"Count to {n}.")) for n, i in enumerate(ids)])
    _wait_completed(api, batch.id, 2)
    # ... when its 24 hours pass: the gateway's own batches.db says so (one field of the
    # batch's state, written in place, as the clock would have made it true).
    with sqlite3.connect(stack.keys_db.parent / DB_NAME) as db:
        moved = db.execute(
            "UPDATE batches SET state = json_set(state, '$.expires_at', ?) WHERE id = ?",
            (int(time.time()) - 1, batch.id),
        ).rowcount
    assert moved == 1

    done = _wait(api, batch.id, "expired", "completed", "failed", "cancelled")
    assert done.status == "expired" and done.expired_at and done.finalizing_at, done
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed) == (5, 2)
    outputs = _lines(api, done.output_file_id)
    assert all(line["response"]["status_code"] == 200 for line in outputs) and len(outputs) == 2
    expired = _lines(api, done.error_file_id)  # each line not run, once, with OpenAI's code
    assert all(line["error"]["code"] == "batch_expired" for line in expired), expired
    assert sorted(line["custom_id"] for line in outputs + expired) == sorted(ids)
    spent = sum(line["response"]["body"]["usage"]["total_tokens"] for line in outputs)
    assert charged(stack, key_id, "prompt") + charged(stack, key_id, "completion") == spent


def test_a_file_with_bad_lines_fails_naming_them_and_charges_nothing(stack: Stack) -> None:
    key_id, secret = create_key(stack, "batch-bad-lines")
    api = client(stack, secret)
    lines = [
        _line("fine", _chat("Hello.")),
        _line("no-model", {**_chat("Hello."), "model": "no-such-model"}),
        _line("bad-field", {**_chat("Hello."), "max_tokens": -1}),
        "not json",
    ]
    done = _wait(api, _submit(api, lines).id, "failed", "completed")
    assert done.status == "failed" and done.failed_at and done.output_file_id is None
    assert done.errors is not None and done.errors.data is not None
    assert [(entry.line, entry.param) for entry in done.errors.data] == [
        (2, "body.model"),
        (3, "body.max_tokens"),
        (4, None),
    ]
    assert [entry.code for entry in done.errors.data][2] == "invalid_json_line"
    assert charged(stack, key_id, "prompt") == charged(stack, key_id, "completion") == 0
