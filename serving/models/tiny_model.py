"""The embedded default model: a few-million-parameter Qwen3 built and trained here, cached.

No machine of this project can download weights, so `ensure_tiny_model()` makes a real
`Qwen3ForCausalLM` checkpoint (bf16 safetensors, config, generation config, Qwen tokenizer
with a ChatML template) from the shipped corpus. It trains briefly so greedy output is
English words, not noise: the same loading, paging, scheduling and API paths as a 7B model.

Same inputs give byte-identical files on the same machine and torch build: training runs in
a fresh interpreter with seeded RNGs, deterministic kernels and a fixed thread count; JSON
keys are sorted; nothing records a time. The output dir holds `build-info.json` with a
fingerprint of the corpus, the build parameters and BUILDER_VERSION; a dir with a matching
fingerprint is reused. Builds go to a temp dir beside the target and are renamed into place,
so an interrupted build never leaves half a model.

Usage: `path = ensure_tiny_model()` or, in tests, `ensure_tiny_model(tmp, steps=10)`.
"""

from __future__ import annotations

import json
import math
import signal
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from serving.errors import ServingError
from serving.models import tiny_tokenizer as tt
from serving.models.cached_build import (
    Progress,
    build_record,
    cached_build,
    child_emit,
    child_result,
    inputs_fingerprint,
    run_child_build,
    write_json,
)
from serving.models.chat_template import ADDED_TOKENS
from serving.paths import models_dir

# Bump when the builder's code changes what it writes; it is part of the fingerprint.
BUILDER_VERSION = "3"
MODEL_NAME = "qwen3-tiny"


@dataclass(frozen=True, kw_only=True)
class TinyModelParams:
    """Everything that decides the built files besides the corpus and the builder's code.

    Usage: `TinyModelParams(steps=10)` for a quick test build.
    """

    vocab_size: int = 2048  # the 48 KB corpus yields ~2,200 merges that occur twice
    hidden_size: int = 256
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    intermediate_size: int = 768  # AWQ packs groups of 128 input channels
    max_position_embeddings: int = 4096
    rope_theta: float = 10000.0
    seed: int = 20240601
    # Small batches, many steps: the lowest loss per CPU second. 270 steps keep the whole build
    # under a minute on 2 idle cores.
    steps: int = 270
    batch_size: int = 2
    seq_len: int = 128
    learning_rate: float = 6e-3
    warmup_steps: int = 20
    # Fixed, not "all cores": the float reduction order, and so the bytes, depend on it.
    num_threads: int = 2

    def __post_init__(self) -> None:
        if self.intermediate_size % 128:
            raise ServingError(f"intermediate_size={self.intermediate_size}: not a multiple of 128")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ServingError(
                f"num_key_value_heads={self.num_key_value_heads}: must divide "
                f"num_attention_heads={self.num_attention_heads}"
            )
        for name in ("steps", "batch_size", "seq_len", "num_threads", "vocab_size"):
            if getattr(self, name) < 1:
                raise ServingError(f"{name}={getattr(self, name)}: must be at least 1")

    def fingerprint(self, corpus: list[Path]) -> str:
        return inputs_fingerprint(BUILDER_VERSION, asdict(self), corpus)


def default_model_dir() -> Path:
    return models_dir() / MODEL_NAME


def ensure_tiny_model(
    out: Path | None = None,
    *,
    force: bool = False,
    steps: int | None = None,
    params: TinyModelParams | None = None,
    progress: Progress | None = None,
) -> Path:
    """Return a dir holding the tiny model, building it first unless a matching build is there."""
    chosen = params or TinyModelParams()
    if steps is not None:
        chosen = replace(chosen, steps=steps)
    target = out or default_model_dir()
    report = progress or Progress()
    corpus = tt.corpus_files()
    if not corpus:
        raise ServingError(f"no corpus files in {tt.corpus_dir()}: the package is incomplete")
    fingerprint = chosen.fingerprint(corpus)

    def build(partial: Path) -> dict[str, Any]:
        record = _run_build(partial, chosen, report)
        return {**build_record(BUILDER_VERSION, MODEL_NAME, asdict(chosen), corpus), **record}

    return cached_build(target, fingerprint, build, name=MODEL_NAME, progress=report, force=force)


def _run_build(out_dir: Path, params: TinyModelParams, report: Progress) -> dict[str, Any]:
    """Train in a fresh interpreter (cached_build.run_child_build says why); its record."""
    return run_child_build(
        __name__,
        [str(out_dir), json.dumps(asdict(params))],
        num_threads=params.num_threads,
        name=MODEL_NAME,
        progress=report,
    )


def build_main(argv: list[str]) -> None:
    """The child's side of `_run_build`: build into argv[0] with the params JSON in argv[1]."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches both; the parent kills us
    out_dir, params = Path(argv[0]), TinyModelParams(**json.loads(argv[1]))
    try:
        record = _build(out_dir, params, tt.read_corpus(), child_emit)
    except ServingError as exc:
        sys.exit(f"{MODEL_NAME}: {exc}")
    child_result(record)


def padded_vocab_size(tokens: int) -> int:
    """The embedding's rows for a tokenizer of `tokens` ids: rounded up to a multiple of 64
    (friendlier matmul shapes)."""
    return -(-tokens // 64) * 64


def planned_vocab_size(params: TinyModelParams) -> int:
    """The vocabulary a build has, without building: the trained ids (the corpus fills
    `params.vocab_size`) and the tool and thinking tokens added after them."""
    return padded_vocab_size(params.vocab_size + len(ADDED_TOKENS))


def qwen3_config(params: TinyModelParams, vocab_size: int, ids: dict[str, int]) -> dict[str, Any]:
    """config.json in the form of the published Qwen3 checkpoints, read by transformers 4 and 5."""
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": ids[tt.ENDOFTEXT],
        "eos_token_id": ids[tt.IM_END],
        "head_dim": params.head_dim,
        "hidden_act": "silu",
        "hidden_size": params.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": params.intermediate_size,
        "max_position_embeddings": params.max_position_embeddings,
        "max_window_layers": params.num_hidden_layers,
        "model_type": "qwen3",
        "num_attention_heads": params.num_attention_heads,
        "num_hidden_layers": params.num_hidden_layers,
        "num_key_value_heads": params.num_key_value_heads,
        "pad_token_id": ids[tt.ENDOFTEXT],
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": params.rope_theta,
        "sliding_window": None,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": vocab_size,
    }


def _learning_rate(step: int, params: TinyModelParams) -> float:
    """Linear warm-up, then cosine decay to a tenth of the peak."""
    if step < params.warmup_steps:
        return params.learning_rate * (step + 1) / params.warmup_steps
    done = (step - params.warmup_steps) / max(1, params.steps - params.warmup_steps)
    return params.learning_rate * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * done)))


def _build(
    out_dir: Path, params: TinyModelParams, texts: list[str], emit: Callable[[str, bool], None]
) -> dict[str, Any]:
    """Write every model file but build-info into out_dir; return the training record."""
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen3Config, Qwen3ForCausalLM

    emit(f"{MODEL_NAME}: training the tokenizer", True)
    tokenizer = tt.train_tokenizer(texts, vocab_size=params.vocab_size)
    tt.save_tokenizer(tokenizer, out_dir, model_max_length=params.max_position_embeddings)
    ids = tt.special_token_ids()
    vocab_size = padded_vocab_size(tokenizer.get_vocab_size())
    config = qwen3_config(params, vocab_size, ids)
    write_json(out_dir / "config.json", config)
    eos = [ids[tt.IM_END], ids[tt.ENDOFTEXT]]
    pad = ids[tt.ENDOFTEXT]
    write_json(
        out_dir / "generation_config.json",
        {"bos_token_id": pad, "eos_token_id": eos, "pad_token_id": pad},
    )
    stream: list[int] = []
    for document in tt.training_documents(texts, seed=params.seed):
        stream.extend(tokenizer.encode(document).ids)
    if len(stream) <= params.seq_len:
        raise ServingError(f"seq_len={params.seq_len}: longer than the corpus ({len(stream)})")

    torch.set_num_threads(params.num_threads)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(params.seed)
    model = Qwen3ForCausalLM(Qwen3Config(**config)).float()
    data = torch.tensor(stream, dtype=torch.long)
    generator = torch.Generator().manual_seed(params.seed)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=params.learning_rate, betas=(0.9, 0.95), weight_decay=0.01
    )
    model.train()
    losses: list[float] = []
    for step in range(params.steps):
        for group in optimizer.param_groups:
            group["lr"] = _learning_rate(step, params)
        starts = torch.randint(
            0, len(stream) - params.seq_len, (params.batch_size,), generator=generator
        )
        batch = torch.stack([data[start : start + params.seq_len] for start in starts.tolist()])
        # No loss on "<|im_start|>role\n": the prompt opens turns. Trained on, the model
        # learned to open one after any newline instead of answering.
        opens = batch == ids[tt.IM_START]
        header = opens.clone()
        header[:, 1:] |= opens[:, :-1]
        header[:, 2:] |= opens[:, :-2]
        loss = model(input_ids=batch, labels=batch.masked_fill(header, -100)).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(float(loss.item()))
        last = step + 1 == params.steps
        emit(
            f"{MODEL_NAME}: training step {step + 1}/{params.steps} loss {losses[-1]:.2f}",
            last or (step + 1) % max(1, params.steps // 10) == 0,
        )
    emit(f"{MODEL_NAME}: saving", True)
    # Tied: lm_head.weight is embed_tokens.weight; checkpoints store the embedding only.
    tensors = {
        name: tensor.detach().to(torch.bfloat16).contiguous()
        for name, tensor in model.state_dict().items()
        if name != "lm_head.weight"
    }
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    tail = losses[-10:]
    return {
        "final_loss": round(sum(tail) / len(tail), 4),
        "initial_loss": round(losses[0], 4),
        "parameters": sum(p.numel() for p in model.parameters()),
        "training_tokens": len(stream),
        "vocab_size": vocab_size,
    }
