"""The store: per key rows, pages, conditional status changes, a reopened file, and a run's
attempt from its start to its result (or its charge as cut)."""

from __future__ import annotations

from pathlib import Path

from serving.gateway.batches.attempts import Attempt
from serving.gateway.batches.objects import BatchRow, FileRow
from serving.gateway.batches.store import BatchStore


def file_row(file_id: str, key: str = "k1", purpose: str = "batch") -> FileRow:
    return FileRow(file_id, key, "f.jsonl", purpose, 1, 100, None)


def test_another_keys_rows_are_as_missing(tmp_path: Path) -> None:
    store = BatchStore(tmp_path / "b.db")
    store.add_file(file_row("file-a", "k1"))
    store.add_batch(BatchRow("batch_a", "k1", "/v1/completions", "file-a", 1, 2))
    assert store.get_file("k2", "file-a") is None and store.get_batch("k2", "batch_a") is None
    assert not store.delete_file("k2", "file-a")
    assert store.get_file("k1", "file-a") is not None
    assert store.list_files("k2", limit=10, after=None, ascending=False, purpose=None) == []


def test_lists_are_newest_first_and_page_after_an_id(tmp_path: Path) -> None:
    store = BatchStore(tmp_path / "b.db")
    for n in range(5):
        store.add_file(file_row(f"file-{n}", purpose="batch" if n % 2 else "batch_output"))
    newest = store.list_files("k1", limit=2, after=None, ascending=False, purpose=None)
    assert [row.id for row in newest] == ["file-4", "file-3"]
    after = store.list_files("k1", limit=10, after="file-3", ascending=False, purpose=None)
    assert [row.id for row in after] == ["file-2", "file-1", "file-0"]
    oldest = store.list_files("k1", limit=10, after="file-1", ascending=True, purpose="batch")
    assert [row.id for row in oldest] == ["file-3"]


def test_a_status_change_needs_the_status_it_was_read_with(tmp_path: Path) -> None:
    store = BatchStore(tmp_path / "b.db")
    row = BatchRow("batch_a", "k1", "/v1/completions", "file-a", 1, 2)
    store.add_batch(row)
    row.status = "cancelling"
    assert store.save_batch(row, "validating")
    row.status = "in_progress"
    assert not store.save_batch(row, "validating")  # the cancel stands
    assert store.batch_status("batch_a") == "cancelling"


def test_state_survives_reopening(tmp_path: Path) -> None:
    store = BatchStore(tmp_path / "b.db")
    row = BatchRow("batch_a", "k1", "/v1/embeddings", "file-a", 1, 2, metadata={"a": "b"})
    store.add_batch(row)
    row.status, row.total, row.times["in_progress_at"] = "in_progress", 3, 5
    store.save_batch(row, "validating")
    store.add_result("batch_a", 2, "two", ok=True, text="{}")
    store.add_result("batch_a", 2, "two", ok=False, text="again")  # the first one stays
    store.add_result("batch_a", 1, "one", ok=False, text="{}")
    store.close()
    reopened = BatchStore(tmp_path / "b.db")
    found = reopened.get_batch("k1", "batch_a")
    assert found == row
    assert [r.id for r in reopened.unfinished_batches()] == ["batch_a"]
    assert reopened.done_lines("batch_a") == {1, 2}
    assert reopened.result_counts("batch_a") == (1, 1)
    assert reopened.results("batch_a") == [(1, False, "{}"), (2, True, "{}")]


def test_a_result_ends_its_attempt_and_a_cut_one_stays_on_record(tmp_path: Path) -> None:
    store = BatchStore(tmp_path / "b.db")
    first, second = (
        Attempt("batch_a", 1, "r1", "k1", "m", 9, 4),
        Attempt("batch_a", 2, "r2", "k1", "m", 8, 4),
    )
    store.start_attempt(first)
    store.start_attempt(second)
    store.add_result("batch_a", 1, "one", ok=True, text="{}", attempt="r1")
    assert store.running_attempts() == [second] and store.done_lines("batch_a") == {1}
    store.close()
    reopened = BatchStore(tmp_path / "b.db")  # a restart finds the run without a result
    assert reopened.running_attempts() == [second]
    reopened.mark_cut("r2")
    reopened.drop_attempt("r2")  # a charged cut stays on record
    assert reopened.running_attempts() == [] and reopened.cut_attempts("batch_a") == [second]
    assert reopened.cut_attempts("batch_b") == []
    third = Attempt("batch_a", 2, "r3", "k1", "m", 8, 4)
    reopened.start_attempt(third)
    reopened.drop_attempt("r3")  # refused for now: nothing ran
    assert reopened.running_attempts() == []
