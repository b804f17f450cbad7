"""The runner: lines run once each, cancel and expiry keep what was done, a restart runs
only the lines without a result, and refusals for now are retried; a run is kept as an
attempt until its result, and a restart charges each run a dead gateway cut once."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from serving.gateway.batches.attempts import Attempt
from serving.gateway.batches.line_call import LineResult
from serving.gateway.batches.objects import WINDOW_S, BatchRow, new_id
from serving.gateway.batches.runner import BatchRunner

from .helpers import CHAT, RESERVED, Setup, jsonl, line, make_setup


def new_batch(setup: Setup, data: bytes, key: str = "k1") -> BatchRow:
    now = int(setup.clock())
    row = BatchRow(
        new_id("batch_"),
        key,
        CHAT,
        setup.upload(key, data),
        now,
        now + WINDOW_S,
    )
    setup.store.add_batch(row)
    return row


async def settle(runner: BatchRunner, setup: Setup, batch_id: str, status: str) -> BatchRow:
    """Rounds until the batch reaches `status` (bounded)."""
    for _ in range(500):
        await runner.run_once()
        row = setup.store.get_batch("k1", batch_id)
        assert row is not None
        if row.status == status:
            return row
        await asyncio.sleep(0.002)
    raise AssertionError(f"batch {batch_id} is {setup.store.batch_status(batch_id)}, not {status}")


def lines_of(setup: Setup, file_id: str | None) -> list[dict[str, object]]:
    assert file_id is not None
    return [json.loads(text) for text in setup.contents.path(file_id).read_text().splitlines()]


def test_a_batch_runs_every_line_once_and_writes_its_files(tmp_path: Path) -> None:
    setup = make_setup(tmp_path)
    fail = LineResult(400, b'{"error": {"message": "bad"}}', "req-2")
    setup.engine.answers["b"] = [fail]

    async def scenario() -> None:
        runner = setup.runner()
        row = await settle(
            runner, setup, new_batch(setup, jsonl(line("a"), line("b"), line("c"))).id, "completed"
        )
        assert (row.total, row.completed, row.failed) == (3, 2, 1)
        assert sorted(setup.engine.calls) == ["a", "b", "c"]
        outputs = lines_of(setup, row.output_file_id)
        assert [o["custom_id"] for o in outputs] == ["a", "c"] and outputs[0]["error"] is None
        errors = lines_of(setup, row.error_file_id)
        assert errors[0]["custom_id"] == "b"
        assert errors[0]["response"] == {
            "status_code": 400,
            "request_id": "req-2",
            "body": {"error": {"message": "bad"}},
        }
        out = setup.store.get_file("k1", row.output_file_id or "")
        assert out is not None and out.purpose == "batch_output"
        assert {"in_progress_at", "finalizing_at", "completed_at"} <= set(row.times)

    asyncio.run(scenario())


def test_invalid_lines_fail_the_batch_and_run_nothing(tmp_path: Path) -> None:
    setup = make_setup(tmp_path)

    async def scenario() -> None:
        row = await settle(
            setup.runner(), setup, new_batch(setup, jsonl(line("a"), line("a"))).id, "failed"
        )
        assert row.errors is not None and row.errors[0]["code"] == "duplicate_custom_id"
        assert setup.engine.calls == [] and row.output_file_id is None

    asyncio.run(scenario())


def test_a_refusal_for_now_is_retried_not_failed(tmp_path: Path) -> None:
    setup = make_setup(tmp_path)
    setup.engine.answers["a"] = [LineResult(429, b"{}", "r", retry_after_s=0.01)] * 2

    async def scenario() -> None:
        row = await settle(
            setup.runner(), setup, new_batch(setup, jsonl(line("a"))).id, "completed"
        )
        assert setup.engine.calls == ["a", "a", "a"] and (row.completed, row.failed) == (1, 0)
        assert len(set(setup.engine.request_ids)) == 3  # a run each, none left running
        assert setup.store.running_attempts() == [] == setup.store.cut_attempts()

    asyncio.run(scenario())


def test_cancel_lets_running_lines_finish_and_starts_no_more(tmp_path: Path) -> None:
    setup = make_setup(tmp_path)
    gate = asyncio.Event

    async def scenario() -> None:
        release = gate()
        engine = setup.engine

        async def slow(kind, caller, body, path, rid):  # type: ignore[no-untyped-def]
            await release.wait()
            return await engine(kind, caller, body, path, rid)

        runner = setup.runner(concurrency=1)
        runner._execute = slow  # one line held running while the batch is cancelled
        row = new_batch(setup, jsonl(line("a"), line("b"), line("c")))
        await settle(runner, setup, row.id, "in_progress")
        await runner.run_once()  # the first line starts
        assert runner.running(row.id) == 1
        found = setup.store.get_batch("k1", row.id)
        assert found is not None
        found.status = "cancelling"
        assert setup.store.save_batch(found, "in_progress")
        await runner.run_once()
        assert setup.store.batch_status(row.id) == "cancelling"  # waits for the running line
        release.set()
        ended = await settle(runner, setup, row.id, "cancelled")
        assert engine.calls == ["a"] and (ended.completed, ended.failed) == (1, 0)
        assert [o["custom_id"] for o in lines_of(setup, ended.output_file_id)] == ["a"]

    asyncio.run(scenario())


def test_expiry_keeps_what_was_done(tmp_path: Path) -> None:
    setup = make_setup(tmp_path)
    setup.engine.answers["b"] = [LineResult(429, b"{}", "r", retry_after_s=3600)]

    async def scenario() -> None:
        runner = setup.runner(concurrency=2)
        row = new_batch(setup, jsonl(line("a"), line("b")))
        await settle(runner, setup, row.id, "in_progress")
        for _ in range(50):
            await runner.run_once()
            await asyncio.sleep(0.002)
        setup.clock.now += WINDOW_S  # b waits for a retry beyond the window: it gave up
        ended = await settle(runner, setup, row.id, "expired")
        assert [o["custom_id"] for o in lines_of(setup, ended.output_file_id)] == ["a"]
        errors = lines_of(setup, ended.error_file_id)
        assert errors[0]["custom_id"] == "b" and errors[0]["error"]["code"] == "batch_expired"  # type: ignore[index]

    asyncio.run(scenario())


def test_a_line_refused_past_the_window_is_not_sent_again_every_round(tmp_path: Path) -> None:
    setup = make_setup(tmp_path)
    setup.engine.answers["b"] = [LineResult(429, b"{}", "r", retry_after_s=3600)] * 100

    async def scenario() -> None:
        runner = setup.runner(concurrency=2)
        row = new_batch(setup, jsonl(line("a"), line("b")))
        setup.clock.now = row.expires_at - 60  # a retry in an hour comes after the window
        await settle(runner, setup, row.id, "in_progress")
        for _ in range(50):
            await runner.run_once()
            await asyncio.sleep(0.002)
        assert setup.engine.calls.count("b") == 1, setup.engine.calls
        setup.clock.now = row.expires_at
        ended = await settle(runner, setup, row.id, "expired")
        assert [o["custom_id"] for o in lines_of(setup, ended.error_file_id)] == ["b"]

    asyncio.run(scenario())


def test_a_line_whose_run_failed_runs_again_and_the_rest_go_on(tmp_path: Path) -> None:
    setup = make_setup(tmp_path)
    engine, failures = setup.engine, ["b"]

    async def flaky(kind, caller, body, path, rid):  # type: ignore[no-untyped-def]
        if json.loads(body)["messages"][0]["content"] in failures:
            failures.clear()
            raise RuntimeError("the line's call failed")
        return await engine(kind, caller, body, path, rid)

    async def scenario() -> None:
        runner = setup.runner(concurrency=1)
        runner._execute = flaky
        row = new_batch(setup, jsonl(line("a"), line("b"), line("c")))
        ended = await settle(runner, setup, row.id, "completed")
        assert sorted(engine.calls) == ["a", "b", "c"] and (ended.completed, ended.failed) == (3, 0)
        written = [str(o["custom_id"]) for o in lines_of(setup, ended.output_file_id)]
        assert sorted(written) == ["a", "b", "c"]

    asyncio.run(scenario())


def test_a_restart_runs_only_the_lines_without_a_result(tmp_path: Path) -> None:
    setup = make_setup(tmp_path)

    async def scenario() -> None:
        row = new_batch(setup, jsonl(line("a"), line("b"), line("c")))
        first = setup.runner()
        await settle(first, setup, row.id, "in_progress")
        await first.stop()
        setup.store.add_result(row.id, 2, "b", ok=True, text='{"custom_id": "b"}')  # done before
        setup.store.close()
        reopened = make_setup(tmp_path)
        ended = await settle(reopened.runner(), reopened, row.id, "completed")
        assert sorted(reopened.engine.calls) == ["a", "c"]
        assert [o["custom_id"] for o in lines_of(reopened, ended.output_file_id)] == ["a", "b", "c"]

    asyncio.run(scenario())


def test_a_run_is_an_attempt_with_its_reservation_until_its_result(tmp_path: Path) -> None:
    setup = make_setup(tmp_path)
    setup.engine.held["a"] = asyncio.Event()

    async def scenario() -> None:
        runner = setup.runner(concurrency=1)
        row = new_batch(setup, jsonl(line("a")))
        await settle(runner, setup, row.id, "in_progress")
        await runner.run_once()
        for _ in range(100):  # the line's task reaches the engine
            if setup.engine.request_ids:
                break
            await asyncio.sleep(0.002)
        (rid,) = setup.engine.request_ids
        assert setup.store.running_attempts() == [Attempt(row.id, 1, rid, "k1", *RESERVED)]
        setup.engine.held["a"].set()
        ended = await settle(runner, setup, row.id, "completed")
        assert lines_of(setup, ended.output_file_id)[0]["response"]["request_id"] == rid  # type: ignore[index]
        assert setup.store.running_attempts() == [] == setup.engine.cuts_charged

    asyncio.run(scenario())


def test_a_stopped_runner_leaves_no_attempt_to_charge_again(tmp_path: Path) -> None:
    # A stop cuts the running line in `call_line`, which charges it as it ends.
    setup = make_setup(tmp_path)
    setup.engine.held["a"] = asyncio.Event()

    async def scenario() -> None:
        runner = setup.runner(concurrency=1)
        row = new_batch(setup, jsonl(line("a")))
        await settle(runner, setup, row.id, "in_progress")
        await runner.run_once()
        for _ in range(100):
            if setup.store.running_attempts() and setup.engine.calls:
                break
            await asyncio.sleep(0.002)
        assert len(setup.store.running_attempts()) == 1
        await runner.stop()
        assert setup.store.running_attempts() == []

    asyncio.run(scenario())


def test_a_restart_charges_each_cut_run_once_before_running_its_line_again(
    tmp_path: Path,
) -> None:
    setup = make_setup(tmp_path)

    async def scenario() -> None:
        row = new_batch(setup, jsonl(line("a"), line("b"), line("c")))
        await settle(setup.runner(), setup, row.id, "in_progress")
        # What a killed gateway leaves: b's result recorded, a and c sent without a result.
        cut = [
            Attempt(row.id, 1, "run-a", "k1", "m", 11, 8),
            Attempt(row.id, 3, "run-c", "k1", "m", 12, 8),
        ]
        for attempt in cut:
            setup.store.start_attempt(attempt)
        setup.store.add_result(row.id, 2, "b", ok=True, text='{"custom_id": "b"}')
        setup.store.close()

        reopened = make_setup(tmp_path)
        runner = reopened.runner()
        await runner.run_once()  # the first round charges them before any line starts
        assert reopened.engine.cuts_charged == cut and reopened.engine.calls == []
        ended = await settle(runner, reopened, row.id, "completed")
        assert sorted(reopened.engine.calls) == ["a", "c"]
        assert [o["custom_id"] for o in lines_of(reopened, ended.output_file_id)] == ["a", "b", "c"]
        assert reopened.store.cut_attempts(row.id) == cut
        assert reopened.store.running_attempts() == []
        reopened.store.close()

        again = make_setup(tmp_path)  # another restart: they were charged already
        await again.runner().run_once()
        assert again.engine.cuts_charged == []

    asyncio.run(scenario())


def test_a_cut_run_whose_charge_failed_is_charged_in_a_later_round(tmp_path: Path) -> None:
    setup = make_setup(tmp_path)
    attempt = Attempt("batch_x", 1, "run-x", "k1", "m", 5, 4)
    setup.store.start_attempt(attempt)
    failures = [RuntimeError("the ledger is down")]
    charged: list[Attempt] = []

    async def charge(cut: Attempt) -> None:
        if failures:
            raise failures.pop()
        charged.append(cut)

    async def scenario() -> None:
        runner = setup.runner()
        runner._charge_cut = charge
        with pytest.raises(RuntimeError):  # the runner's loop logs it and goes on
            await runner.run_once()
        assert charged == [] and setup.store.running_attempts() == [attempt]
        await runner.run_once()
        await runner.run_once()
        assert charged == [attempt] and setup.store.cut_attempts() == [attempt]

    asyncio.run(scenario())
