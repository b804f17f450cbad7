"""The routes, driven as the app drives them: uploads streamed and bounded, each key's own
files and batches, another key's ids answered as missing ones."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from serving.gateway.auth import Principal
from serving.gateway.batches.api import BatchApi, Limits
from serving.gateway.errors import BodyTooLargeError, GatewayError, InvalidRequestError
from serving.gateway.types import Message

from .helpers import Setup, jsonl, line, make_setup

BOUNDARY = b"xyz"
K1, K2 = Principal("k1"), Principal("k2")


def form(data: bytes, purpose: str = "batch") -> bytes:
    return (
        b'--xyz\r\nContent-Disposition: form-data; name="purpose"\r\n\r\n'
        + purpose.encode()
        + b'\r\n--xyz\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"\r\n'
        b"Content-Type: application/octet-stream\r\n\r\n" + data + b"\r\n--xyz--\r\n"
    )


class Client:
    def __init__(self, setup: Setup, max_file_bytes: int = 10_000) -> None:
        self.setup = setup
        limits = Limits(max_file_bytes=max_file_bytes, max_body_bytes=10_000)
        self.api = BatchApi(
            setup.store,
            setup.contents,
            setup.runner(),
            setup.owners,
            limits=limits,
            clock=setup.clock,
        )

    def call(
        self,
        caller: Principal,
        method: str,
        path: str,
        body: bytes = b"",
        query: bytes = b"",
        content_type: bytes = b"application/json",
    ) -> tuple[int, bytes]:
        sent: list[Message] = []
        chunks = [body[i : i + 7] for i in range(0, len(body), 7)] or [b""]

        async def receive() -> Message:
            chunk = chunks.pop(0)
            return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}

        async def send(message: Message) -> None:
            sent.append(message)

        headers = [(b"content-type", content_type)]
        asyncio.run(self.api.serve(caller, method, path, query, headers, receive, send, b"r"))
        return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])

    def json(self, caller: Principal, method: str, path: str, **kwargs: Any) -> Any:
        status, body = self.call(caller, method, path, **kwargs)
        assert status == 200
        return json.loads(body)

    def upload(self, caller: Principal, data: bytes, purpose: str = "batch") -> Any:
        return self.json(
            caller,
            "POST",
            "/v1/files",
            body=form(data, purpose),
            content_type=b"multipart/form-data; boundary=xyz",
        )


def test_a_file_is_uploaded_listed_read_and_deleted(tmp_path: Path) -> None:
    client = Client(make_setup(tmp_path))
    data = jsonl(line("a"), line("b"))
    made = client.upload(K1, data)
    assert (made["object"], made["bytes"], made["filename"], made["purpose"]) == (
        "file",
        len(data),
        "in.jsonl",
        "batch",
    )
    assert client.json(K1, "GET", f"/v1/files/{made['id']}") == made
    assert client.call(K1, "GET", f"/v1/files/{made['id']}/content") == (200, data)
    assert [f["id"] for f in client.json(K1, "GET", "/v1/files")["data"]] == [made["id"]]
    deleted = client.json(K1, "DELETE", f"/v1/files/{made['id']}")
    assert deleted == {"id": made["id"], "object": "file", "deleted": True}
    assert not client.setup.contents.path(made["id"]).exists()


def test_another_keys_ids_are_404_as_missing_ones(tmp_path: Path) -> None:
    client = Client(make_setup(tmp_path, K1, K2))
    file_id = client.upload(K1, jsonl(line("a")))["id"]
    batch = client.json(
        K1,
        "POST",
        "/v1/batches",
        body=json.dumps(
            {
                "input_file_id": file_id,
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
            }
        ).encode(),
    )
    for path in (
        f"/v1/files/{file_id}",
        f"/v1/files/{file_id}/content",
        f"/v1/batches/{batch['id']}",
    ):
        with pytest.raises(GatewayError) as theirs:
            client.call(K2, "GET", path)
        with pytest.raises(GatewayError) as missing:
            client.call(K2, "GET", path.replace(file_id, "file-0").replace(batch["id"], "batch_0"))
        assert theirs.value.http_status == missing.value.http_status == 404
        assert theirs.value.message.split(":")[0] == missing.value.message.split(":")[0]
    assert client.json(K2, "GET", "/v1/files")["data"] == []
    assert client.json(K2, "GET", "/v1/batches")["data"] == []
    with pytest.raises(InvalidRequestError):  # K2 cannot start a batch on K1's file
        client.call(
            K2,
            "POST",
            "/v1/batches",
            body=json.dumps(
                {
                    "input_file_id": file_id,
                    "endpoint": "/v1/chat/completions",
                    "completion_window": "24h",
                }
            ).encode(),
        )


def test_an_oversized_upload_is_413_and_leaves_nothing(tmp_path: Path) -> None:
    client = Client(make_setup(tmp_path), max_file_bytes=50)
    with pytest.raises(BodyTooLargeError):
        client.upload(K1, b"x" * 51)
    assert list(client.setup.contents.directory.iterdir()) == []
    assert client.json(K1, "GET", "/v1/files")["data"] == []


def test_bad_requests_name_their_field(tmp_path: Path) -> None:
    client = Client(make_setup(tmp_path))
    with pytest.raises(InvalidRequestError) as caught:
        client.upload(K1, b"{}", purpose="fine-tune")
    assert caught.value.param == "purpose"
    assert list(client.setup.contents.directory.iterdir()) == []
    file_id = client.upload(K1, jsonl(line("a")))["id"]
    good = {
        "input_file_id": file_id,
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    }
    for field, value in (
        ("completion_window", "48h"),
        ("endpoint", "/v1/score"),
        ("metadata", {"a": 1}),
    ):
        with pytest.raises(InvalidRequestError) as caught:
            client.call(K1, "POST", "/v1/batches", body=json.dumps({**good, field: value}).encode())
        assert caught.value.param == field


def test_a_batch_is_created_listed_and_cancelled(tmp_path: Path) -> None:
    client = Client(make_setup(tmp_path))
    file_id = client.upload(K1, jsonl(line("a")))["id"]
    body = {
        "input_file_id": file_id,
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
        "metadata": {"team": "x"},
    }
    made = client.json(K1, "POST", "/v1/batches", body=json.dumps(body).encode())
    assert (made["status"], made["metadata"]) == ("validating", {"team": "x"})
    assert made["expires_at"] - made["created_at"] == 24 * 3600
    listed = client.json(K1, "GET", "/v1/batches", query=b"limit=1")
    assert [b["id"] for b in listed["data"]] == [made["id"]] and not listed["has_more"]
    cancelled = client.json(K1, "POST", f"/v1/batches/{made['id']}/cancel")
    assert cancelled["status"] == "cancelling" and cancelled["cancelling_at"] is not None
