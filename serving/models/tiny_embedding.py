"""A tiny Qwen3 embedding model, in the form Qwen3-Embedding ships: the tiny chat model's weights.

`ensure_tiny_embedding()` writes the tiny Qwen3 (`serving.models.tiny_model`, built first if
needed) as Qwen/Qwen3-Embedding-0.6B lays its files out, so vLLM's pooling runner serves it
the way it serves the published model:

    config.json              the chat model's (architectures Qwen3ForCausalLM, as published)
    model.safetensors        the decoder without its `model.` prefix (a Qwen3Model, no LM head)
    tokenizer.json           the chat model's, appending <|endoftext|> to every input (the
                             token whose last hidden state is the embedding)
    modules.json, 1_Pooling/config.json
                             sentence-transformers: last-token pooling, then Normalize
    config_sentence_transformers.json
                             the query and document prompts of Qwen3-Embedding

An embedding is the last token's final hidden state (after the last RMSNorm), L2-normalised.
The weights were trained for next tokens, not retrieval: the vectors are deterministic and
real, their similarities not meaningful.

Usage: `path = ensure_tiny_embedding()`; in tests `ensure_tiny_embedding(tmp)`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from serving.models import tiny_tokenizer as tt
from serving.models.cached_build import Progress, write_json
from serving.models.derived_checkpoint import (
    UNCHANGED_FILES,
    WEIGHTS,
    copy_files,
    ensure_derived,
    read_safetensors,
    write_safetensors,
)

# Bump when the builder's code changes what it writes; it is part of the fingerprint.
BUILDER_VERSION = "1"
MODEL_NAME = "qwen3-tiny-embedding"
DECODER_PREFIX = "model."  # Qwen3ForCausalLM's name for its Qwen3Model
# Appended to every tokenized input, as Qwen3-Embedding's tokenizer does since its June 2025
# update: its last hidden state is the embedding.
EOS = tt.ENDOFTEXT
POOLING_DIR = "1_Pooling"
# Qwen3-Embedding's instruction for retrieval queries (config_sentence_transformers.json);
# documents go in as they are.
QUERY_PROMPT = (
    "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"
)


def ensure_tiny_embedding(
    out: Path | None = None,
    *,
    force: bool = False,
    base: Path | None = None,
    progress: Progress | None = None,
) -> Path:
    """Return a dir holding the embedding model, building it unless a matching build is there."""
    return ensure_derived(
        MODEL_NAME,
        BUILDER_VERSION,
        {"eos": EOS, "pooling": "lasttoken", "normalize": True},
        _write,
        out=out,
        force=force,
        base=base,
        progress=progress,
    )


def _write(base: Path, out: Path) -> dict[str, Any]:
    copy_files(base, out, UNCHANGED_FILES)
    tensors = read_safetensors(base / WEIGHTS)
    decoder = {
        name.removeprefix(DECODER_PREFIX): tensor
        for name, tensor in tensors.items()
        if name.startswith(DECODER_PREFIX)
    }
    write_safetensors(out / WEIGHTS, decoder)
    (out / "tokenizer.json").write_text(
        appending_eos((base / "tokenizer.json").read_text(encoding="utf-8")), encoding="utf-8"
    )
    hidden = json.loads((base / "config.json").read_text(encoding="utf-8"))["hidden_size"]
    _write_sentence_transformers(out, hidden)
    return {"dimensions": hidden, "tensors": len(decoder)}


def appending_eos(tokenizer_json: str) -> str:
    """A tokenizer.json that appends EOS to every sequence (its pairs too), as a
    TemplateProcessing post-processor, the way Qwen3-Embedding's does."""
    from tokenizers import Tokenizer, processors

    tokenizer = Tokenizer.from_str(tokenizer_json)
    eos_id = tokenizer.token_to_id(EOS)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"$A:0 {EOS}:0",
        pair=f"$A:0 {EOS}:0 $B:1 {EOS}:1",
        special_tokens=[(EOS, eos_id)],
    )
    return tokenizer.to_str(pretty=True) + "\n"


def _write_sentence_transformers(out: Path, hidden: int) -> None:
    """The sentence-transformers files Qwen3-Embedding ships; vLLM reads its pooling type and
    normalisation from them (`get_pooling_config`)."""
    st = "sentence_transformers.models"
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": f"{st}.Transformer"},
        {"idx": 1, "name": "1", "path": POOLING_DIR, "type": f"{st}.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": f"{st}.Normalize"},
    ]
    (out / "modules.json").write_text(
        json.dumps(modules, indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )
    (out / POOLING_DIR).mkdir()
    write_json(
        out / POOLING_DIR / "config.json",
        {
            "include_prompt": True,
            "pooling_mode_cls_token": False,
            "pooling_mode_lasttoken": True,
            "pooling_mode_max_tokens": False,
            "pooling_mode_mean_sqrt_len_tokens": False,
            "pooling_mode_mean_tokens": False,
            "pooling_mode_weightedmean_tokens": False,
            "word_embedding_dimension": hidden,
        },
    )
    write_json(
        out / "config_sentence_transformers.json",
        {
            "default_prompt_name": None,
            "prompts": {"document": "", "query": QUERY_PROMPT},
            "similarity_fn_name": "cosine",
        },
    )
