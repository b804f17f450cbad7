"""A tiny reranker in Qwen3-Reranker's form: the tiny chat model judging "yes" or "no".

Qwen3-Reranker is a causal LM: its prompt (serving/profiles/templates/qwen3-reranker.jinja: a
system turn, the instruction, query and document, an empty think block) asks for "yes" or
"no", and the relevance score is
P(yes) = sigmoid(logit("yes") - logit("no")) at the last position. vLLM serves the published
checkpoint as it is, with `hf_overrides` that make it a one-label classifier whose weight is
the LM head's "yes" row minus its "no" row (`from_2_way_softmax`, vLLM's
model_executor/models/adapters.py). `ensure_tiny_reranker()` writes the tiny Qwen3
(`serving.models.tiny_model`, built first if needed) in that form, so the CPU profile runs
exactly the overrides and template the GPU profiles run:

    config.json, model.safetensors, tokenizer_config.json    the chat model's
    tokenizer.json    the chat model's BPE plus one merge, "n" + "o" -> "no"

vLLM finds the two tokens with `convert_tokens_to_ids`, so each must be one token, as in
Qwen's vocabulary. The tiny tokenizer learned "yes" but only "Ġno" (with its leading space):
the build appends the merge as the lowest-ranked one (every earlier merge still applies
first) with the next free id, which the chat model's padded embedding already has a row for,
and copies "Ġno"'s row into it, so "no" is scored with what the chat model learned of "no".

Usage: `path = ensure_tiny_reranker()`; in tests `ensure_tiny_reranker(tmp)`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from serving.errors import ServingError
from serving.models.cached_build import Progress
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
MODEL_NAME = "qwen3-tiny-reranker"
EMBEDDING = "model.embed_tokens.weight"  # tied: also the LM head
# vLLM's classifier_from_token for Qwen3-Reranker: [false token, true token].
NO, YES = "no", "yes"
NO_SOURCE = "Ġno"  # byte-level BPE's " no": the row the new "no" starts from


def ensure_tiny_reranker(
    out: Path | None = None,
    *,
    force: bool = False,
    base: Path | None = None,
    progress: Progress | None = None,
) -> Path:
    """Return a dir holding the reranker, building it unless a matching build is there."""
    return ensure_derived(
        MODEL_NAME,
        BUILDER_VERSION,
        {"false_token": NO, "true_token": YES, "false_row_from": NO_SOURCE},
        _write,
        out=out,
        force=force,
        base=base,
        progress=progress,
    )


def _write(base: Path, out: Path) -> dict[str, Any]:
    copy_files(base, out, UNCHANGED_FILES)
    tokenizer, no_id = with_single_token_no((base / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = json.loads(tokenizer)["model"]["vocab"]
    if YES not in vocab:
        raise ServingError(f"the tiny tokenizer has no single token {YES!r}")
    tensors = read_safetensors(base / WEIGHTS)
    embedding = tensors[EMBEDDING]
    if no_id >= embedding.shape[0]:
        raise ServingError(f"id {no_id} for {NO!r} is past the {embedding.shape[0]} embedding rows")
    tensors[EMBEDDING] = embedding.with_row(no_id, embedding.row(vocab[NO_SOURCE]))
    write_safetensors(out / WEIGHTS, tensors)
    (out / "tokenizer.json").write_text(tokenizer, encoding="utf-8")
    return {"false_token_id": no_id, "true_token_id": vocab[YES]}


def with_single_token_no(tokenizer_json: str) -> tuple[str, int]:
    """The tokenizer with "no" as one token (the id after every other), and that id."""
    data = json.loads(tokenizer_json)
    model = data["model"]
    if NO in model["vocab"]:
        raise ServingError(f"the tiny tokenizer already has {NO!r}: nothing to add")
    taken = [*model["vocab"].values(), *(token["id"] for token in data["added_tokens"])]
    no_id = max(taken) + 1
    model["vocab"][NO] = no_id
    model["merges"].append(list(NO))  # ["n", "o"]: the merge of lowest rank
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n", no_id
