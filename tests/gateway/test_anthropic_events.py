"""Usage read from Anthropic Messages responses: whole bodies, and streams event by event,
by each event's type only (never usage-shaped text a client could have sent)."""

from __future__ import annotations

import json

import pytest

from serving.gateway.anthropic_events import event_usage, generated_bytes, message_usage
from serving.gateway.usage import TEXTLESS_TOKENS, ResponseMeter, Usage
from tests.gateway.fake_messages import ECHO_WORDS, event, message


def stream(words: list[str], *, final: bool = True) -> bytes:
    start = {**message([]), "content": [], "usage": {"input_tokens": 11, "output_tokens": 0}}
    events = [
        event("message_start", message=start),
        event("content_block_start", index=0, content_block={"type": "text", "text": ""}),
        *(
            event("content_block_delta", index=0, delta={"type": "text_delta", "text": word})
            for word in words
        ),
    ]
    if final:
        usage = {"input_tokens": 7, "cache_read_input_tokens": 4, "output_tokens": len(words)}
        events.append(event("message_delta", delta={"stop_reason": "end_turn"}, usage=usage))
        events.append(event("message_stop"))
    return b"".join(events)


def meter() -> ResponseMeter:
    return ResponseMeter(strip_usage=False, messages=True)


@pytest.mark.parametrize(
    ("usage", "counts"),
    [
        ({"input_tokens": 5, "output_tokens": 2}, (5, 2)),
        ({"input_tokens": 5, "cache_read_input_tokens": 3, "output_tokens": 2}, (8, 2)),
        (
            {
                "input_tokens": 1,
                "cache_read_input_tokens": 3,
                "cache_creation_input_tokens": 4,
                "output_tokens": 0,
            },
            (8, 0),
        ),
        ({"input_tokens": 5, "cache_read_input_tokens": None, "output_tokens": 2}, (5, 2)),
        ({"input_tokens": 5}, None),
        ({"input_tokens": -1, "output_tokens": 2}, None),
        ({"input_tokens": 5, "output_tokens": 2.0}, None),
        ({"input_tokens": True, "output_tokens": 2}, None),
        ({"input_tokens": 5, "cache_read_input_tokens": "3", "output_tokens": 2}, None),
        ("5", None),
    ],
)
def test_message_usage_sums_the_prompt_vllm_counted(usage: object, counts: object) -> None:
    assert message_usage(usage) == counts


def test_only_the_start_and_delta_events_carry_usage() -> None:
    assert event_usage({"type": "message_delta", "usage": {"x": 1}}) == ("final", {"x": 1})
    assert event_usage({"type": "message_start", "message": {"usage": {"y": 2}}}) == (
        "start",
        {"y": 2},
    )
    assert event_usage({"type": "content_block_delta", "usage": {"output_tokens": 0}}) is None
    assert event_usage({"type": "message_start", "message": "x"}) == ("start", None)


def test_a_whole_body_is_read_with_its_cache_fields() -> None:
    reader = meter()
    usage = {"input_tokens": 2, "cache_read_input_tokens": 5, "cache_creation_input_tokens": 1}
    body = {**message(["a", "b"]), "usage": {**usage, "output_tokens": 2}}
    reader.read_json(json.dumps(body).encode())
    assert reader.usage == Usage(8, 2)
    assert reader.problem is None


def test_a_stream_gives_its_prompt_first_and_its_usage_last() -> None:
    reader = meter()
    data = stream(["one", " two"])
    relayed = reader.feed(data) + reader.end()
    assert relayed == data  # nothing is stripped from a Messages stream
    assert reader.start_usage == Usage(11, 0)
    assert reader.usage == Usage(11, 2)
    assert reader.problem is None and not reader.inband_error


@pytest.mark.parametrize("size", [1, 7, 64])
def test_events_split_anywhere_are_read_the_same(size: int) -> None:
    reader = meter()
    data = stream(ECHO_WORDS)
    relayed = b"".join(reader.feed(data[i : i + size]) for i in range(0, len(data), size))
    assert relayed + reader.end() == data
    assert reader.usage == Usage(11, len(ECHO_WORDS))


def test_usage_shaped_text_in_a_delta_is_content() -> None:
    reader = meter()
    reader.feed(stream(ECHO_WORDS, final=False))
    # the echoed `"usage":{..."output_tokens":0}` and `message_delta` text changed nothing
    assert reader.usage is None
    assert reader.start_usage == Usage(11, 0)
    echoed = sum(len(word.encode()) for word in ECHO_WORDS)
    assert reader.delta_bytes == echoed
    assert reader.streamed_tokens(1) == echoed + reader.events + TEXTLESS_TOKENS


def test_a_cut_stream_is_bounded_by_the_text_its_deltas_carried() -> None:
    reader = meter()
    reader.feed(stream(["héllo", " wörld"], final=False))
    assert reader.usage is None
    assert reader.delta_bytes == len("héllo wörld".encode())
    assert reader.streamed_tokens(1) == reader.delta_bytes + 4 + TEXTLESS_TOKENS
    reader.overtaken = True  # vLLM ran on past what was read: no bound
    assert reader.streamed_tokens(1) is None


def test_thinking_tool_names_and_arguments_count_as_generated() -> None:
    tool = {"type": "tool_use", "id": "toolu_1", "name": "get_time", "input": {}}
    data = b"".join(
        [
            event("content_block_delta", delta={"type": "thinking_delta", "thinking": "hm"}),
            event("content_block_delta", delta={"type": "signature_delta", "signature": "abc"}),
            event("content_block_start", index=1, content_block=tool),
            event(
                "content_block_delta", delta={"type": "input_json_delta", "partial_json": '{"tz":'}
            ),
            event("content_block_start", index=2, content_block={"type": "text", "text": "x"}),
        ]
    )
    # thinking 2 + name 8 + arguments 6; a signature and an id are not generated text
    assert generated_bytes(data) == 2 + 8 + 6


def test_an_error_event_is_an_in_band_error() -> None:
    reader = meter()
    error = {"type": "overloaded_error", "message": "busy"}
    reader.feed(stream(["a"], final=False) + event("error", error=error))
    assert reader.inband_error


def test_a_final_usage_that_is_not_counts_is_a_problem() -> None:
    reader = meter()
    reader.feed(event("message_delta", delta={}, usage={"input_tokens": "x", "output_tokens": 1}))
    assert reader.usage is None and reader.problem == "bad_json"


def test_a_start_without_a_prompt_count_is_no_count() -> None:
    reader = meter()
    start = {**message([]), "usage": {"input_tokens": 0, "output_tokens": 0}}
    reader.feed(event("message_start", message=start))
    assert reader.start_usage is None  # a cut stream then keeps the prompt estimate
