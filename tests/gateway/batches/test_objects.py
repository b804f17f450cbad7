"""The objects parse as the official client's types, every status and field included."""

from __future__ import annotations

from openai.pagination import SyncCursorPage
from openai.types import Batch, FileObject

from serving.gateway.batches.objects import (
    TIMESTAMPS,
    BatchRow,
    FileRow,
    batch_object,
    file_object,
    page,
)


def test_a_file_object_is_openais() -> None:
    row = FileRow("file-1", "k1", "in.jsonl", "batch", 12, 100, 200)
    parsed = FileObject.model_validate(file_object(row))
    assert (parsed.id, parsed.bytes, parsed.purpose, parsed.expires_at) == (
        "file-1",
        12,
        "batch",
        200,
    )


def test_a_batch_object_is_openais_in_every_status() -> None:
    for status in (
        "validating",
        "in_progress",
        "finalizing",
        "completed",
        "failed",
        "expired",
        "cancelling",
        "cancelled",
    ):
        row = BatchRow(
            "batch_1",
            "k1",
            "/v1/chat/completions",
            "file-1",
            100,
            200,
            status,
            {"team": "a"},
            {name: 150 for name in TIMESTAMPS},
            3,
            2,
            1,
            "file-2",
            None,
            [{"code": "x", "message": "m", "param": None, "line": 2}],
        )
        parsed = Batch.model_validate(batch_object(row))
        assert parsed.status == status
        assert parsed.request_counts is not None and parsed.request_counts.failed == 1
        assert parsed.errors is not None and parsed.errors.data is not None
        assert parsed.errors.data[0].line == 2 and parsed.cancelled_at == 150


def test_a_page_says_whether_there_is_more() -> None:
    objects = [{"id": f"file-{n}"} for n in range(3)]
    first = page(objects, 2)
    assert (first["first_id"], first["last_id"], first["has_more"]) == ("file-0", "file-1", True)
    assert len(first["data"]) == 2 and page(objects, 3)["has_more"] is False
    assert page([], 5) == {
        "object": "list",
        "data": [],
        "first_id": None,
        "last_id": None,
        "has_more": False,
    }
    assert SyncCursorPage[FileObject] is not None
