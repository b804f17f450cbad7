"""Fixtures: the fake upstream, a tokenizer trained on the shipped corpus, a prompts file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from loadtest.prompts import Tokenizer, generate_prompts, load_tokenizer, write_prompts
from loadtest.workload import load_workload
from serving.models.tiny_tokenizer import read_corpus, save_tokenizer, train_tokenizer
from tests.loadtest.fake_upstream import FakeConfig, RunningFake, serve_fake

API_KEY = "sk-loadtest-fake"


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model's tokenizer files, trained here (a second; no model build needed)."""
    directory = tmp_path_factory.mktemp("tokenizer")
    tokenizer = train_tokenizer(read_corpus(), vocab_size=2048)
    save_tokenizer(tokenizer, directory, model_max_length=2048)
    return directory


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir: Path) -> Tokenizer:
    return load_tokenizer(str(tokenizer_dir))


@pytest.fixture
def fake() -> Iterator[RunningFake]:
    with serve_fake(FakeConfig(ttft_s=0.03, itl_s=0.005, api_key=API_KEY)) as running:
        yield running


@pytest.fixture
def prompts_file(tmp_path: Path, tokenizer: Tokenizer) -> Path:
    path = tmp_path / "prompts.jsonl"
    write_prompts(
        generate_prompts(load_workload("short-chat"), tokenizer, max_model_len=2048), path
    )
    return path
