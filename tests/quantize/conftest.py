"""A small random-weight Qwen3 checkpoint with a real tokenizer: AWQ's input, built in seconds."""

from __future__ import annotations

from pathlib import Path

import pytest

from serving.models import tiny_tokenizer as tt
from serving.models.cached_build import write_json
from serving.models.tiny_model import TinyModelParams, qwen3_config

SMALL = TinyModelParams(
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    vocab_size=512,
)


def write_qwen3(out: Path, params: TinyModelParams, *, seed: int = 0) -> Path:
    """A Qwen3ForCausalLM with random weights, saved as the tiny builder saves (bf16, tied)."""
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen3Config, Qwen3ForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    tokenizer = tt.train_tokenizer(tt.read_corpus(), vocab_size=params.vocab_size)
    tt.save_tokenizer(tokenizer, out, model_max_length=2048)
    vocab = -(-tokenizer.get_vocab_size() // 64) * 64
    config = qwen3_config(params, vocab, tt.special_token_ids())
    write_json(out / "config.json", config)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(Qwen3Config(**config))
    tensors = {
        name: tensor.detach().to(torch.bfloat16).contiguous()
        for name, tensor in model.state_dict().items()
        if name != "lm_head.weight"
    }
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


@pytest.fixture(scope="session")
def small_qwen3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_qwen3(tmp_path_factory.mktemp("small-qwen3"), SMALL)
