"""The tiny embedding model is the tiny Qwen3's decoder in Qwen3-Embedding's layout: the same
weights without the `model.` prefix, a tokenizer that appends <|endoftext|>, and the
sentence-transformers files from which vLLM takes last-token pooling and normalisation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModel, AutoTokenizer

from serving.models.cached_build import Progress
from serving.models.tiny_embedding import EOS, MODEL_NAME, QUERY_PROMPT, ensure_tiny_embedding
from serving.models.tiny_model import ensure_tiny_model

QUIET = Progress(quiet=True)


@pytest.fixture(scope="module")
def base() -> Path:
    return ensure_tiny_model(progress=QUIET)


@pytest.fixture(scope="module")
def built(base: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_tiny_embedding(tmp_path_factory.mktemp("emb") / MODEL_NAME, progress=QUIET)


def test_the_weights_are_the_chat_models_decoder_without_its_prefix(
    base: Path, built: Path
) -> None:
    chat = load_file(str(base / "model.safetensors"))
    embedding = load_file(str(built / "model.safetensors"))
    assert embedding.keys() == {name.removeprefix("model.") for name in chat}
    for name, tensor in embedding.items():
        assert torch.equal(tensor, chat[f"model.{name}"]), name


def test_transformers_loads_it_as_a_qwen3_model(built: Path) -> None:
    model = AutoModel.from_pretrained(built)
    assert type(model).__name__ == "Qwen3Model"


def test_every_input_ends_with_endoftext_pairs_too(base: Path, built: Path) -> None:
    chat, tokenizer = AutoTokenizer.from_pretrained(base), AutoTokenizer.from_pretrained(built)
    eos = tokenizer.convert_tokens_to_ids(EOS)
    text = "The weather is nice today."
    assert tokenizer(text)["input_ids"] == [*chat(text)["input_ids"], eos]
    pair = tokenizer("a query", "a passage")["input_ids"]
    assert pair.count(eos) == 2 and pair[-1] == eos
    # token ids sent as they are get nothing appended (vLLM encodes only text)
    assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text


def test_vllm_reads_last_token_pooling_and_normalisation(built: Path) -> None:
    from vllm.transformers_utils.config import get_pooling_config

    config = get_pooling_config(str(built))
    assert config == {"use_activation": True, "seq_pooling_type": "LAST"}


def test_the_query_prompt_is_qwen3_embeddings(built: Path) -> None:
    prompts = json.loads((built / "config_sentence_transformers.json").read_text())["prompts"]
    assert prompts == {"query": QUERY_PROMPT, "document": ""}
    assert QUERY_PROMPT.endswith("\nQuery:")


def test_same_inputs_give_byte_identical_files(built: Path, tmp_path: Path) -> None:
    again = ensure_tiny_embedding(tmp_path / "again", progress=QUIET)
    files = sorted(p.relative_to(built) for p in built.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(again) for p in again.rglob("*") if p.is_file())
    for name in files:
        assert (built / name).read_bytes() == (again / name).read_bytes(), name
    assert (again / "1_Pooling").stat().st_mode & 0o777 == 0o755  # vLLM may run as another user
