"""ResponseMeter: usage read from JSON and SSE, the usage chunk stripped, problems recorded."""

from __future__ import annotations

import itertools
import json

from hypothesis import given
from hypothesis import strategies as st

from serving.gateway.usage import MAX_OTHER_BODY, MAX_PENDING, ResponseMeter, Usage, usage_of
from tests.gateway.fake_bodies import chat_chunk, sse, usage_chunk

TOKENS = [sse(chat_chunk(index, word)) for index, word in enumerate(["a", " b", " c"])]
FINISH = sse(chat_chunk(3, "", "stop"))
USAGE = sse(usage_chunk(True, completion_tokens=3))
DONE = b"data: [DONE]\n\n"
STREAM = b"".join([*TOKENS, FINISH, USAGE, DONE])


def relay(meter: ResponseMeter, chunks: list[bytes]) -> bytes:
    return b"".join(meter.feed(chunk) for chunk in chunks) + meter.end()


def test_usage_chunk_is_read_and_stripped() -> None:
    meter = ResponseMeter(strip_usage=True)
    out = relay(meter, [*TOKENS, FINISH, USAGE, DONE])
    assert out == b"".join([*TOKENS, FINISH, DONE])
    assert meter.usage == Usage(3, 3)
    assert meter.events == 6
    assert (meter.problem, meter.inband_error) == (None, False)


def test_usage_chunk_kept_when_the_client_asked() -> None:
    meter = ResponseMeter(strip_usage=False)
    assert relay(meter, [STREAM]) == STREAM
    assert meter.usage == Usage(3, 3)


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_any_chunking_gives_the_same_bytes(cuts: list[int]) -> None:
    points = sorted({0, len(STREAM), *cuts})
    chunks = [STREAM[start:end] for start, end in itertools.pairwise(points)]
    meter = ResponseMeter(strip_usage=True)
    assert relay(meter, chunks) == b"".join([*TOKENS, FINISH, DONE])
    assert meter.usage == Usage(3, 3)
    assert meter.problem is None


def test_partial_events_are_held_back_until_complete() -> None:
    meter = ResponseMeter(strip_usage=True)
    first = TOKENS[0]
    assert meter.feed(first[:10]) == b""
    assert meter.feed(first[10:] + TOKENS[1][:5]) == first
    assert meter.feed(TOKENS[1][5:]) == TOKENS[1]


def test_crlf_events() -> None:
    crlf = STREAM.replace(b"\n\n", b"\r\n\r\n")
    meter = ResponseMeter(strip_usage=True)
    out = relay(meter, [crlf[:50], crlf[50:]])
    assert meter.usage == Usage(3, 3)
    assert b'"usage"' not in out and out.endswith(b"data: [DONE]\r\n\r\n")


def test_generated_text_mentioning_usage_is_untouched() -> None:
    tricky = sse(chat_chunk(0, 'the "usage" and "error" fields: {"usage": 1}'))
    meter = ResponseMeter(strip_usage=True)
    assert relay(meter, [tricky, DONE]) == tricky + DONE
    assert meter.usage is None and not meter.inband_error and meter.problem is None


def test_in_band_error_is_recorded_and_passed_through() -> None:
    error = sse({"error": {"message": "boom", "type": "InternalServerError", "code": 500}})
    meter = ResponseMeter(strip_usage=True)
    assert relay(meter, [TOKENS[0], error, DONE]) == TOKENS[0] + error + DONE
    assert meter.inband_error and meter.usage is None


def test_garbage_is_recorded_not_raised() -> None:
    meter = ResponseMeter(strip_usage=True)
    out = relay(meter, [b'data: {"usage": nope\n\n', b"no field here\n\n", DONE])
    assert out.endswith(DONE)
    assert meter.problem == "bad_json" and meter.usage is None

    unframed = ResponseMeter(strip_usage=True)
    assert relay(unframed, [b"x" * (MAX_PENDING + 1)]) == b"x" * (MAX_PENDING + 1)
    assert unframed.problem == "bad_sse"

    no_blank_line = ResponseMeter(strip_usage=True)
    assert relay(no_blank_line, [b"data: [DONE]"]) == b"data: [DONE]"
    assert no_blank_line.problem == "bad_sse"


def test_whole_json_bodies() -> None:
    meter = ResponseMeter(strip_usage=False)
    meter.read_json(json.dumps({"usage": {"prompt_tokens": 9, "completion_tokens": 4}}).encode())
    assert meter.usage == Usage(9, 4)
    bad = ResponseMeter(strip_usage=False)
    bad.read_json(b"<html>")
    assert bad.problem == "bad_json" and bad.usage is None


def test_streamed_non_sse_bodies_read_usage_from_their_end() -> None:
    body = json.dumps(
        {
            "choices": [{"text": "x" * 20_000}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 7, "details": {"cached": 1}},
        }
    ).encode()
    meter = ResponseMeter(strip_usage=False)
    for start in range(0, len(body), 1000):
        meter.feed_other(body[start : start + 1000])
    meter.end_other()
    assert meter.usage == Usage(5, 7)


def test_usage_of_reads_counts_and_rejects_nonsense() -> None:
    details = {"prompt_tokens": 9, "prompt_tokens_details": {"cached_tokens": 4}}
    assert usage_of({**details, "completion_tokens": 2}) == Usage(9, 2)
    assert usage_of({"input_tokens": 9, "output_tokens": 2}, responses=True) == Usage(9, 2)
    for value in ({}, {"prompt_tokens": 1}, {"prompt_tokens": -1, "completion_tokens": 0},
                  {"prompt_tokens": True, "completion_tokens": 1}, [1, 2], "usage",
                  {"prompt_tokens": 1.0, "completion_tokens": 1}):  # fmt: skip
        assert usage_of(value) is None
    assert usage_of({"prompt_tokens": 9, "completion_tokens": 2}, responses=True) is None


def test_a_non_sse_stream_is_parsed_whole_up_to_its_limit() -> None:
    meter = ResponseMeter(strip_usage=False)
    meter.feed_other(b"x" * (MAX_OTHER_BODY + 1))
    meter.end_other()
    assert meter.usage is None and meter.problem == "bad_json"


def test_usage_of_null_is_not_a_problem() -> None:
    meter = ResponseMeter(strip_usage=True)
    chunk = sse({**chat_chunk(0, "a"), "usage": None})
    assert meter.feed(chunk) == chunk
    assert meter.usage is None and meter.problem is None


# -- usage in every chunk (continuous_usage_stats), as vLLM's compact JSON writes it --------


def running_chunk(content: str, completion_tokens: int, index: int = 0) -> bytes:
    """A chunk of vLLM's chat stream with the usage so far (captured from vLLM 0.32)."""
    return (
        b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,'
        b'"model":"qwen3-tiny","choices":[{"index":%d,"delta":{"content":"%s"},'
        b'"logprobs":null,"finish_reason":null,"token_ids":null}],"usage":{"prompt_tokens":14,'
        b'"total_tokens":%d,"completion_tokens":%d,"completion_tokens_details":'
        b'{"reasoning_tokens":0}}}\n\n'
        % (index, content.encode(), 14 + completion_tokens, completion_tokens)
    )


def without_usage(chunk: bytes) -> bytes:
    start = chunk.index(b',"usage":')
    return chunk[:start] + chunk[chunk.index(b"}}", start) + 2 :]


# vLLM merged three tokens into the second event for a reader that fell behind.
RUNNING = [running_chunk("a", 1), running_chunk(" b c d", 4), running_chunk(" e", 5)]
FINAL = sse(usage_chunk(True, completion_tokens=5)).replace(b", ", b",").replace(b": ", b":")


def test_running_usage_is_kept_as_vllms_count_and_cut_out_unless_asked() -> None:
    meter = ResponseMeter(strip_usage=True, chunk_usage=True, strip_chunk_usage=True)
    out = relay(meter, [*RUNNING, FINAL, DONE])
    assert out == b"".join([*map(without_usage, RUNNING), DONE])
    assert b'"usage"' not in out
    assert meter.running_usage == Usage(14, 5) and meter.usage == Usage(3, 5)

    asked = ResponseMeter(strip_usage=False, chunk_usage=True)
    assert relay(asked, [*RUNNING, FINAL, DONE]) == b"".join([*RUNNING, FINAL, DONE])
    assert asked.running_usage == Usage(14, 5) and asked.usage == Usage(3, 5)


def test_the_final_usage_is_kept_while_running_usage_is_cut() -> None:
    meter = ResponseMeter(strip_usage=False, chunk_usage=True, strip_chunk_usage=True)
    assert relay(meter, [*RUNNING, FINAL]) == b"".join([*map(without_usage, RUNNING), FINAL])


def test_a_cut_stream_counts_vllms_tokens_not_its_events() -> None:
    meter = ResponseMeter(strip_usage=True, chunk_usage=True, strip_chunk_usage=True)
    relay(meter, RUNNING[:2])  # cut after the merged event
    assert (meter.events, meter.streamed_tokens(1)) == (2, 4)
    assert meter.usage is None  # a running count is not a finished response's usage
    plain = ResponseMeter(strip_usage=True)
    relay(plain, TOKENS[:2])  # no running usage (not asked upstream): one token per event
    assert plain.streamed_tokens(1) == 2


def test_with_several_choices_the_count_bounds_every_choice() -> None:
    meter = ResponseMeter(strip_usage=True, chunk_usage=True, strip_chunk_usage=True)
    # Choice 1 at 3 tokens; choice 0's event for the same step may still be on its way.
    relay(meter, [running_chunk("a", 2, index=0), running_chunk("b", 3, index=1)])
    assert meter.streamed_tokens(2) == (3 + 1) * 2


def test_events_of_several_tokens_raise_the_bounds_by_as_many() -> None:
    # the gateway asked vLLM for up to 4 tokens per event (its stream_interval)
    meter = ResponseMeter(
        strip_usage=True, chunk_usage=True, strip_chunk_usage=True, tokens_per_event=4
    )
    relay(meter, [running_chunk("a", 8, index=0), running_chunk("b", 9, index=1)])
    assert meter.streamed_tokens(2) == (9 + 4) * 2
    assert meter.streamed_tokens(1) == 9  # one choice: vLLM's count itself
    unread = ResponseMeter(strip_usage=True, tokens_per_event=4)
    relay(unread, TOKENS[:2])  # no running count: every event may hold 4
    assert unread.streamed_tokens(1) == 2 * 4


def test_a_field_after_the_running_usage_stays_and_the_usage_is_still_read() -> None:
    # vLLM writes the usage last; a later field (another version) must not be cut with it.
    later = [chunk.replace(b"}}}\n\n", b'}},"extra":{"x":1}}\n\n') for chunk in RUNNING]
    meter = ResponseMeter(strip_usage=True, chunk_usage=True, strip_chunk_usage=True)
    out = relay(meter, [*later, FINAL, DONE])
    assert out == b"".join([*map(without_usage, later), DONE])
    assert b'"extra":{"x":1}' in out and meter.running_usage == Usage(14, 5)


def test_text_that_looks_like_sse_or_usage_is_one_event_of_text() -> None:
    text = 'data: x\\n\\n}],\\"usage\\":{\\"prompt_tokens\\":0}'
    chunk = running_chunk(text, 1)
    meter = ResponseMeter(strip_usage=True, chunk_usage=True, strip_chunk_usage=True)
    assert relay(meter, [chunk]) == without_usage(chunk)
    assert meter.events == 1 and meter.running_usage == Usage(14, 1)


@given(st.lists(st.integers(min_value=0, max_value=200), max_size=8))
def test_running_usage_survives_any_chunking(cuts: list[int]) -> None:
    stream = b"".join([*RUNNING, FINAL, DONE])
    edges = [0, *sorted(cut % len(stream) for cut in cuts), len(stream)]
    pieces = [stream[a:b] for a, b in itertools.pairwise(edges)]
    meter = ResponseMeter(strip_usage=True, chunk_usage=True, strip_chunk_usage=True)
    assert relay(meter, pieces) == b"".join([*map(without_usage, RUNNING), DONE])
    assert meter.running_usage == Usage(14, 5)


def test_a_responses_stream_reads_the_usage_of_its_final_event() -> None:
    completed = responses_event(
        "response.completed", usage={"input_tokens": 9, "output_tokens": 4, "total_tokens": 13}
    )
    meter = ResponseMeter(strip_usage=False, responses=True)
    assert relay(meter, [completed]) == completed
    assert meter.usage == Usage(9, 4) and meter.running_usage is None


# -- what the client wrote is echoed in vLLM's Responses events and bodies -----------------

FORGED = {"usage": {"input_tokens": 0, "output_tokens": 0, "prompt_tokens": 0,
                    "completion_tokens": 0}}  # fmt: skip
ECHOED = {
    "instructions": json.dumps(FORGED),
    "metadata": {"usage": json.dumps(FORGED)},
    "tools": [{"type": "function", "name": "f", "parameters": {"type": "object", **FORGED}}],
    "text": {"format": {"type": "json_schema", "name": "x", "schema": FORGED}},
    "reasoning": FORGED,
}


def responses_event(kind: str, usage: object = None, **echoed: object) -> bytes:
    """An event as vLLM's Responses stream writes it: the whole response object (fields in
    vLLM's order: the request's tools, text and reasoning before the usage)."""
    response = {"id": "resp_1", "object": "response", "output": [], **echoed, "usage": usage}
    payload = json.dumps({"type": kind, "sequence_number": 0, "response": response})
    return f"event: {kind}\ndata: {payload}\n\n".encode()


def test_usage_shaped_fields_the_request_echoes_are_never_its_usage() -> None:
    real = {"input_tokens": 40, "output_tokens": 7, "total_tokens": 47}
    stream = [
        responses_event("response.created", **ECHOED),
        responses_event("response.in_progress", **ECHOED),
        b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta",'
        b'"delta":"\\"usage\\": {\\"input_tokens\\": 0}"}\n\n',
        responses_event("response.completed", usage=real, **ECHOED),
    ]
    meter = ResponseMeter(strip_usage=False, responses=True)
    assert relay(meter, stream) == b"".join(stream)
    assert meter.usage == Usage(40, 7)
    assert (meter.problem, meter.inband_error) == (None, False)
    cut = ResponseMeter(strip_usage=False, responses=True)
    relay(cut, stream[:3])  # no final event: no usage, whatever the echoes say
    assert cut.usage is None


def test_a_whole_responses_body_reads_its_top_level_usage() -> None:
    body = {"id": "resp_1", "object": "response", **ECHOED, "usage": {"input_tokens": 40,
            "output_tokens": 7}, "user": json.dumps(FORGED)}  # fmt: skip
    meter = ResponseMeter(strip_usage=False, responses=True)
    meter.read_json(json.dumps(body).encode())
    assert meter.usage == Usage(40, 7)
    chat = ResponseMeter(strip_usage=False)
    chat.read_json(json.dumps({"choices": [], **FORGED, "x": FORGED}).encode())
    assert chat.usage == Usage(0, 0)  # the top-level usage is vLLM's: read it


@given(st.sampled_from(sorted(ECHOED)), st.integers(min_value=0, max_value=3))
def test_an_echo_in_any_event_never_sets_the_usage(field: str, where: int) -> None:
    echoed = {field: ECHOED[field]}
    kinds = ["response.created", "response.in_progress", "response.output_item.added"]
    stream = [responses_event(kind, **echoed) for kind in kinds]
    stream.insert(where, responses_event("response.completed", usage={"input_tokens": 5,
                  "output_tokens": 6}, **echoed))  # fmt: skip
    meter = ResponseMeter(strip_usage=False, responses=True)
    relay(meter, stream)
    assert meter.usage == Usage(5, 6)


def delta_event(text: str) -> bytes:
    payload = json.dumps({"type": "response.output_text.delta", "item_id": "msg_1",
                          "output_index": 0, "content_index": 0, "delta": text,
                          "sequence_number": 4})  # fmt: skip
    return f"event: response.output_text.delta\ndata: {payload}\n\n".encode()


def test_a_cut_responses_stream_is_bounded_by_its_deltas_text_not_its_events() -> None:
    # vLLM merged six tokens into one delta for a reader that fell behind; the lifecycle
    # events before it (the request echoed in full) generated nothing.
    big = {"tools": [{"type": "function", "name": "f", "description": "x" * 5000}]}
    stream = [responses_event("response.created", **big),
              responses_event("response.in_progress", **big), delta_event("a"),
              delta_event(" merged six tokens é")]  # fmt: skip
    meter = ResponseMeter(strip_usage=False, responses=True)
    relay(meter, stream)
    assert meter.delta_bytes == len("a") + len(" merged six tokens é".encode())
    bound = meter.streamed_tokens(1)
    assert bound is not None and bound >= 1 + 6  # covers the tokens
    assert bound == meter.delta_bytes + len(stream) + 4  # the echoes count for nothing


# -- pooling answers (embeddings, score, rerank) ----------------------------------------------

EMBEDDINGS = {
    "object": "list",
    "data": [{"index": 0, "object": "embedding", "embedding": [0.25] * 4}],
    "usage": {"prompt_tokens": 7, "total_tokens": 7, "completion_tokens": 0},
}
# A rerank answer echoes the documents, and its usage has no completion_tokens.
FORGED_TEXT = '{"usage": {"prompt_tokens": 1, "total_tokens": 1}}'
RERANK = {
    "id": "rerank-1",
    "usage": {"prompt_tokens": 40, "total_tokens": 40},
    "results": [{"index": 0, "document": {"text": FORGED_TEXT}, "relevance_score": 0.5}],
}


def test_a_pooling_answer_is_charged_its_prompt_tokens() -> None:
    for answer, usage in ((EMBEDDINGS, Usage(7, 0)), (RERANK, Usage(40, 0))):
        whole = ResponseMeter(strip_usage=False, pooling=True)
        whole.read_json(json.dumps(answer).encode())
        streamed = ResponseMeter(strip_usage=False, pooling=True)
        text = json.dumps(answer).encode()
        for start in range(0, len(text), 5):  # a body over the whole-body limit, in pieces
            streamed.feed_other(text[start : start + 5])
        streamed.end_other()
        assert whole.usage == streamed.usage == usage
        assert whole.problem is streamed.problem is None


def test_a_streamed_pooling_answer_is_scanned_not_kept() -> None:
    meter = ResponseMeter(strip_usage=False, pooling=True)
    vector = b"[" + b"0.125," * 1000 + b"0.5]"
    meter.feed_other(b'{"data":[')
    for _ in range((MAX_OTHER_BODY // len(vector)) + 2):  # past what a chat answer may keep
        meter.feed_other(b'{"embedding":' + vector + b"},")
    meter.feed_other(b'{"embedding":[]}],"usage":{"prompt_tokens":5,"total_tokens":5}}')
    meter.end_other()
    assert meter.usage == Usage(5, 0) and meter.problem is None


def test_a_pooling_usage_that_is_not_counts_is_a_problem() -> None:
    for usage, problem in (
        ({"prompt_tokens": 3}, "bad_json"),
        ({"prompt_tokens": 3, "total_tokens": 2}, "bad_json"),
        ({"prompt_tokens": True, "total_tokens": 1}, "bad_json"),
        (None, None),  # no usage: charged the reservation, recorded as missing
    ):
        meter = ResponseMeter(strip_usage=False, pooling=True)
        meter.read_json(json.dumps({"data": [], "usage": usage}).encode())
        assert (meter.usage, meter.problem) == (None, problem)
    cut = ResponseMeter(strip_usage=False, pooling=True)
    cut.feed_other(b'{"data": [], "usage": {"prompt_tokens": 3, "total_tokens": 3}')
    cut.end_other()
    assert (cut.usage, cut.problem) == (None, "bad_json")
