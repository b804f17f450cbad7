"""The prompt estimate's string measure against the tokenizer: Qwen's tokenizers normalise text
to NFC before the byte-level BPE, and NFC can make a string up to three times its UTF-8 bytes."""

from __future__ import annotations

import json
import unicodedata
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from serving.gateway.openai_request import parse_completion_request
from serving.gateway.prompt_estimate import text_bytes

# Each grows under NFC: a Hebrew presentation form (3 -> 6 bytes), a Devanagari letter with a
# nukta (3 -> 6), a musical symbol (4 -> 8).
GROWING = ("\ufb2c", "\u0958", "\U0001d15e")


@pytest.mark.parametrize("char", GROWING)
def test_a_string_costs_at_least_the_bytes_of_its_nfc_form(char: str) -> None:
    text = char * 10
    assert text_bytes(text) >= len(unicodedata.normalize("NFC", text).encode())
    assert text_bytes({"nested": [text]}) >= len(unicodedata.normalize("NFC", text).encode())


@given(st.text(max_size=40))
def test_text_bytes_bounds_the_nfc_bytes_of_any_string(text: str) -> None:
    assert text_bytes(text) >= len(
        unicodedata.normalize("NFC", text).encode("utf-8", "surrogatepass")
    )


@pytest.mark.parametrize("char", GROWING)
def test_chat_and_completion_estimates_bound_the_tokenizer_on_text_nfc_grows(
    tokenizer: Any, char: str
) -> None:
    text = char * 40
    messages = [{"role": "user", "content": text}]
    chat = parse_completion_request(
        "chat", json.dumps({"model": "m", "messages": messages}).encode()
    )
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    ids = rendered["input_ids"] if isinstance(rendered, dict) else rendered
    assert chat.prompt_estimate >= len(ids)
    completion = parse_completion_request(
        "completion", json.dumps({"model": "m", "prompt": text}).encode()
    )
    assert completion.prompt_estimate >= len(tokenizer(text)["input_ids"])
