"""The tiny reranker is the tiny Qwen3 with "no" as one token (as "yes" already is), so vLLM's
Qwen3-Reranker overrides find both; its tokenization and weights differ from the chat model's
only there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer

from serving.errors import ServingError
from serving.models import tiny_tokenizer as tt
from serving.models.cached_build import Progress
from serving.models.tiny_model import ensure_tiny_model
from serving.models.tiny_reranker import (
    MODEL_NAME,
    NO,
    NO_SOURCE,
    YES,
    ensure_tiny_reranker,
    with_single_token_no,
)

QUIET = Progress(quiet=True)
EMBEDDING = "model.embed_tokens.weight"


@pytest.fixture(scope="module")
def base() -> Path:
    return ensure_tiny_model(progress=QUIET)


@pytest.fixture(scope="module")
def built(base: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_tiny_reranker(tmp_path_factory.mktemp("rr") / MODEL_NAME, progress=QUIET)


def test_yes_and_no_are_single_tokens_as_vllm_looks_them_up(base: Path, built: Path) -> None:
    chat, tokenizer = AutoTokenizer.from_pretrained(base), AutoTokenizer.from_pretrained(built)
    assert chat.convert_tokens_to_ids(NO) is None  # why the build adds it
    no, yes = tokenizer.convert_tokens_to_ids([NO, YES])
    assert no == len(chat) and yes == chat.convert_tokens_to_ids(YES)
    assert tokenizer(NO)["input_ids"] == [no] and tokenizer(YES)["input_ids"] == [yes]
    info = json.loads((built / "build-info.json").read_text())
    assert (info["false_token_id"], info["true_token_id"]) == (no, yes)


def test_the_merge_only_joins_n_and_o_left_unmerged(base: Path, built: Path) -> None:
    """Ranked last, the new merge changes a text's tokens only where the chat tokenizer left
    "n" and "o" side by side: elsewhere every corpus paragraph tokenizes the same."""
    chat, tokenizer = AutoTokenizer.from_pretrained(base), AutoTokenizer.from_pretrained(built)
    changed = 0
    for paragraph in tt.paragraphs(tt.read_corpus()):
        before, after = chat.tokenize(paragraph), tokenizer.tokenize(paragraph)
        joined: list[str] = []
        for token in before:
            if joined and joined[-1] == "n" and token == "o":
                joined[-1] = NO
                changed += 1
            else:
                joined.append(token)
        assert after == joined, paragraph
    assert tokenizer.tokenize("no") == [NO] and chat.tokenize("no") == ["n", "o"]
    assert changed < 50  # a handful of words across the corpus


def test_no_starts_from_the_chat_models_row_for_space_no(base: Path, built: Path) -> None:
    chat = load_file(str(base / "model.safetensors"))
    reranker = load_file(str(built / "model.safetensors"))
    vocab = json.loads((built / "tokenizer.json").read_text())["model"]["vocab"]
    no, source = vocab[NO], vocab[NO_SOURCE]
    assert torch.equal(reranker[EMBEDDING][no], chat[EMBEDDING][source])
    rest = torch.ones(chat[EMBEDDING].shape[0], dtype=torch.bool)
    rest[no] = False
    assert torch.equal(reranker[EMBEDDING][rest], chat[EMBEDDING][rest])
    for name in chat.keys() - {EMBEDDING}:
        assert torch.equal(reranker[name], chat[name]), name


def test_a_tokenizer_that_has_no_already_is_refused(built: Path) -> None:
    with pytest.raises(ServingError, match="already has 'no'"):
        with_single_token_no((built / "tokenizer.json").read_text())


def test_same_inputs_give_byte_identical_files(built: Path, tmp_path: Path) -> None:
    again = ensure_tiny_reranker(tmp_path / "again", progress=QUIET)
    assert sorted(p.name for p in built.iterdir()) == sorted(p.name for p in again.iterdir())
    for path in built.iterdir():
        assert path.read_bytes() == (again / path.name).read_bytes(), path.name
