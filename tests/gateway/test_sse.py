"""One server-sent event's data, and that data as JSON."""

from __future__ import annotations

from serving.gateway.sse import event_data, json_value


def test_the_data_of_an_event_with_other_fields_and_several_data_lines() -> None:
    assert event_data(b'event: message_stop\ndata: {"type":"message_stop"}') == (
        b'{"type":"message_stop"}'
    )
    assert json_value(event_data(b"data: [1,\ndata: 2]\nid: 1\n\n")) == [1, 2]
    assert event_data(b"data: [DONE]") == b"[DONE]"
    assert event_data(b": a comment") == b""


def test_json_of_the_data_or_none() -> None:
    assert json_value(b'{"a": [1]}') == {"a": [1]}
    assert json_value(b"[DONE]") is None
    assert json_value(b"") is None
