from __future__ import annotations

import json

from loadtest.sse import StreamMeter


def data(obj: object) -> bytes:
    return f"data: {json.dumps(obj)}\n\n".encode()


def token(text: str) -> bytes:
    return data({"choices": [{"index": 0, "delta": {"content": text}}]})


USAGE = data({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}})


def test_timings_follow_token_chunks_not_the_usage_chunk() -> None:
    meter = StreamMeter(start=10.0)
    meter.feed(token("a"), 10.5)
    meter.feed(token("b"), 10.6)
    meter.feed(token("c"), 10.8)
    meter.feed(USAGE, 11.5)
    meter.feed(b"data: [DONE]\n\n", 11.6)
    result = meter.finish(expected_output_tokens=3)
    assert result.ok and result.error is None
    assert result.ttft_s == 0.5
    assert [round(g, 6) for g in result.itl_s] == [0.1, 0.2]
    assert result.e2e_s is not None and abs(result.e2e_s - 0.8) < 1e-9
    assert (result.prompt_tokens, result.output_tokens) == (7, 3)
    assert result.tpot_s is not None and abs(result.tpot_s - 0.15) < 1e-9


def test_lines_split_across_reads_and_comments() -> None:
    meter = StreamMeter(start=0.0)
    whole = b": ping\n\n" + token("a") + USAGE + b"data: [DONE]\n\n"
    for index in range(0, len(whole), 7):
        meter.feed(whole[index : index + 7], 1.0)
    result = meter.finish()
    assert result.ok
    assert result.output_tokens == 3


def test_error_event_after_200_is_a_failure() -> None:
    meter = StreamMeter(start=0.0)
    meter.feed(token("a"), 1.0)
    meter.feed(data({"error": {"message": "engine died", "type": "server_error"}}), 1.1)
    result = meter.finish()
    assert not result.ok
    assert result.error == "SSE error event: engine died"


def test_missing_usage_done_or_tokens_are_failures() -> None:
    no_usage = StreamMeter(start=0.0)
    no_usage.feed(token("a") + b"data: [DONE]\n\n", 1.0)
    assert no_usage.finish().error == "stream ended without a usage chunk"
    no_done = StreamMeter(start=0.0)
    no_done.feed(token("a") + USAGE, 1.0)
    assert no_done.finish().error == "stream ended without [DONE]"
    empty = StreamMeter(start=0.0)
    assert empty.finish().error == "stream ended without a token chunk"
    garbage = StreamMeter(start=0.0)
    garbage.feed(b"data: {not json\n\n", 1.0)
    assert (garbage.finish().error or "").startswith("non-JSON SSE data")


def test_ignore_eos_checks_the_token_count() -> None:
    meter = StreamMeter(start=0.0)
    meter.feed(token("a") + USAGE + b"data: [DONE]\n\n", 1.0)
    assert meter.finish(expected_output_tokens=4).error == "3 output tokens, expected 4"
