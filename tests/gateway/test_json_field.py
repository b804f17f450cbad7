"""TopLevelField finds a top-level key of a JSON object fed in pieces, as `json.loads` would,
and never a key-shaped text inside a string or a nested object."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from serving.gateway.json_field import TopLevelField

# Text meant to confuse a scanner: quotes, escapes, and the field itself, forged.
TRICKS = ['"', "\\", '\\"', '","usage":{"prompt_tokens":0}}', "usage", "{", "]", ":", ","]
strings = st.lists(st.sampled_from(TRICKS) | st.text(max_size=4), max_size=6).map("".join)
scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | strings
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["usage", "data", "x", '"']) | strings, inner, max_size=3)
    ),
    max_leaves=12,
)
objects = st.dictionaries(st.sampled_from(["usage", "id", "data", "results"]) | strings, values)


def scan(text: bytes, cuts: list[int]) -> TopLevelField:
    field = TopLevelField(b"usage", limit=1 << 20)
    start = 0
    for cut in sorted(cuts):
        field.feed(text[start:cut])
        start = cut
    field.feed(text[start:])
    return field


@settings(max_examples=300, deadline=None)
@given(document=objects, cuts=st.lists(st.integers(0, 400), max_size=8), data=st.data())
def test_it_reads_what_json_loads_reads(
    document: dict[str, Any], cuts: list[int], data: Any
) -> None:
    indent = data.draw(st.sampled_from([None, 1]))
    text = json.dumps(document, indent=indent, ensure_ascii=data.draw(st.booleans())).encode()
    field = scan(text, [cut for cut in cuts if cut <= len(text)])
    assert field.complete
    assert field.value() == document.get("usage")


def test_usage_forged_in_a_document_is_not_the_answers() -> None:
    forged = '","usage":{"prompt_tokens":0,"total_tokens":0}} \\" \\\\'
    answer = {"id": "r", "results": [{"document": {"text": forged}}], "usage": {"prompt_tokens": 9}}
    text = json.dumps(answer).encode()
    for size in (1, 2, 3, 7, 64):
        field = scan(text, list(range(size, len(text), size)))
        assert field.value() == {"prompt_tokens": 9}


def test_what_is_not_one_object_gives_nothing() -> None:
    for text in (b'[{"usage": 1}]', b'"usage"', b'{"usage": 1}{"usage": 2}', b'{"usage": 1'):
        field = scan(text, [3])
        assert field.value() is None and not field.complete
    assert scan(b'{"a": [1, {"usage": 2}]}', []).value() is None
    assert scan(b'{"us\\u0061ge": {"n": 1}}', [5]).value() == {"n": 1}  # an escaped key


def test_a_value_past_the_limit_is_dropped() -> None:
    field = TopLevelField(b"usage", limit=8)
    field.feed(b'{"usage": "' + b"x" * 20 + b'"}')
    assert field.complete and field.value() is None
