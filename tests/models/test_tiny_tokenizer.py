"""The tiny model's corpus and tokenizer: deterministic, lossless, Qwen-compatible files."""

from __future__ import annotations

import unicodedata
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from serving.models import tiny_tokenizer as tt
from serving.models.chat_template import ADDED_TOKENS

VOCAB_SIZE = 2048


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return tt.train_tokenizer(tt.read_corpus(), vocab_size=VOCAB_SIZE)


@pytest.fixture(scope="module")
def saved(tokenizer: Tokenizer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tokenizer")
    tt.save_tokenizer(tokenizer, out, model_max_length=4096)
    return out


def test_corpus_is_shipped_english_of_the_intended_size() -> None:
    files = tt.corpus_files()
    assert len(files) >= 5
    total = sum(path.stat().st_size for path in files)
    assert 40_000 <= total <= 80_000
    assert len(tt.paragraphs(tt.read_corpus())) > 100


def test_training_is_deterministic(tokenizer: Tokenizer) -> None:
    again = tt.train_tokenizer(tt.read_corpus(), vocab_size=VOCAB_SIZE)
    assert again.to_str() == tokenizer.to_str()


def test_vocabulary_has_the_requested_size(tokenizer: Tokenizer) -> None:
    assert tokenizer.get_vocab_size(with_added_tokens=False) == VOCAB_SIZE
    assert tokenizer.get_vocab_size() == VOCAB_SIZE + len(ADDED_TOKENS)


def test_tool_and_think_markers_are_single_tokens_after_the_vocabulary(
    tokenizer: Tokenizer, saved: Path
) -> None:
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(saved)
    for offset, token in enumerate(ADDED_TOKENS):
        assert tokenizer.token_to_id(token) == VOCAB_SIZE + offset
        assert loaded.convert_tokens_to_ids(token) == VOCAB_SIZE + offset
    text = '<think>\nhm\n</think>\n\n<tool_call>\n{"name": "f"}\n</tool_call>'
    ids = tokenizer.encode(text).ids
    assert ids[0] == tokenizer.token_to_id("<think>")
    assert ids[-1] == tokenizer.token_to_id("</tool_call>")
    # Not special, as in Qwen's files: vLLM's parsers still see them in the decoded text.
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    assert loaded.decode(ids, skip_special_tokens=True) == text


def test_special_tokens_are_single_ids_in_order(tokenizer: Tokenizer) -> None:
    for expected_id, token in enumerate(tt.SPECIAL_TOKENS):
        assert tokenizer.token_to_id(token) == expected_id == tt.special_token_ids()[token]
        assert tokenizer.encode(token).ids == [expected_id]
    ids = tokenizer.encode(f"{tt.IM_START}user\nhello{tt.IM_END}").ids
    assert ids[0] == 1
    assert ids[-1] == 2


@pytest.mark.parametrize(
    "text",
    [
        "Tell me about the weather.",
        "  leading spaces, tabs\tand\nnew lines\n\n",
        "Numbers 12345 and 3.14, café naïve, 日本語, emoji 🙂.",
    ],
)
def test_text_round_trips(tokenizer: Tokenizer, text: str) -> None:
    assert tokenizer.decode(tokenizer.encode(text).ids) == text


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=200))
def test_any_text_round_trips_up_to_nfc(tokenizer: Tokenizer, text: str) -> None:
    # NFC is the normaliser Qwen uses; everything else is bytes, so nothing is lost.
    ids = tokenizer.encode(text).ids
    assert tokenizer.decode(ids, skip_special_tokens=False) == unicodedata.normalize("NFC", text)


def test_corpus_compresses_like_an_english_bpe(tokenizer: Tokenizer) -> None:
    text = "\n\n".join(tt.read_corpus())
    assert len(text) / len(tokenizer.encode(text).ids) > 3.5


def test_transformers_loads_it_with_the_same_ids(tokenizer: Tokenizer, saved: Path) -> None:
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(saved)
    text = "What is the KV cache? It keeps keys and values.<|im_end|>"
    assert loaded(text)["input_ids"] == tokenizer.encode(text).ids
    assert loaded.eos_token == tt.IM_END
    assert loaded.pad_token == tt.ENDOFTEXT
    assert loaded.bos_token is None


def test_chat_template_renders_chatml(saved: Path) -> None:
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(saved)
    messages = [
        {"role": "system", "content": "You are brief."},
        {"role": "user", "content": "Tell me about the weather."},
        {"role": "assistant", "content": "It is mild."},
        {"role": "user", "content": "And tomorrow?"},
    ]
    prompt = loaded.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert prompt == (
        "<|im_start|>system\nYou are brief.<|im_end|>\n"
        "<|im_start|>user\nTell me about the weather.<|im_end|>\n"
        "<|im_start|>assistant\nIt is mild.<|im_end|>\n"
        "<|im_start|>user\nAnd tomorrow?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert prompt == tt.render_chat(messages, add_generation_prompt=True)
    closed = loaded.apply_chat_template(messages, add_generation_prompt=False, tokenize=False)
    assert closed == tt.render_chat(messages, add_generation_prompt=False)


def test_saved_json_is_byte_stable(tokenizer: Tokenizer, saved: Path, tmp_path: Path) -> None:
    tt.save_tokenizer(tokenizer, tmp_path, model_max_length=4096)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert (tmp_path / name).read_bytes() == (saved / name).read_bytes()


def test_training_documents_mix_plain_text_and_chats() -> None:
    documents = tt.training_documents(tt.read_corpus(), seed=1)
    assert documents == tt.training_documents(tt.read_corpus(), seed=1)
    chats = [doc for doc in documents if doc.startswith(tt.IM_START)]
    plain = [doc for doc in documents if doc.endswith(tt.ENDOFTEXT)]
    assert len(chats) + len(plain) == len(documents)
    assert len(chats) > 100
    assert len(plain) > 100
    assert all(doc.count(tt.IM_START) == 2 and doc.endswith(f"{tt.IM_END}\n") for doc in chats)
