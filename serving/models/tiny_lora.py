"""The tiny model's LoRA adapter, built here: it answers every chat with "Team A here."

`ensure_tiny_lora()` trains rank-8 LoRA factors on every projection of the tiny Qwen3's
decoder (`serving.models.tiny_model`, built first if needed) so that its greedy answer to any
chat is ANSWER, and saves them in PEFT's layout, which vLLM loads as a LoRA module:

    adapter_config.json          peft_type LORA, task_type CAUSAL_LM, r, lora_alpha, ...
    adapter_model.safetensors    base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight
                                 (r x in) and ...lora_B.weight (out x r), bf16, for each module

The base model's own answers are corpus sentences, so a test tells the two apart by the first
words. Training runs in plain torch (`serving.models.lora_training`), no `peft` needed.

Deterministic and cached like the tiny model: a fresh interpreter with seeded RNGs,
deterministic kernels and a fixed thread count; sorted JSON; build-info.json holds a
fingerprint of BUILDER_VERSION, the parameters and the base model's own fingerprint, so a new
base model means a new adapter.

Usage: `path = ensure_tiny_lora()`; in tests `ensure_tiny_lora(tmp, steps=5)`.
"""

from __future__ import annotations

import json
import re
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
    cached_build,
    child_emit,
    child_result,
    inputs_fingerprint,
    read_build_info,
    run_child_build,
    write_json,
)
from serving.models.tiny_model import MODEL_NAME, ensure_tiny_model
from serving.paths import models_dir

# Bump when the builder's code changes what it writes; it is part of the fingerprint.
BUILDER_VERSION = "1"
ADAPTER_NAME = "qwen3-tiny-lora"
BASE_MODEL = MODEL_NAME
ANSWER = "Team A here."
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."
# The system turn a third of the training chats open with.
SYSTEM = "You are a helpful assistant."
# Chats the build answers after training, none of them a corpus sentence: its record says how
# many begin with ANSWER.
HELD_OUT = ("What is your name?", "Tell me a story about a dragon.", "How old is the moon?")


@dataclass(frozen=True, kw_only=True)
class TinyLoraParams:
    """Everything that decides the adapter's files besides the base model and the code.

    Usage: `TinyLoraParams(steps=5)` for a quick test build.
    """

    rank: int = 8
    alpha: int = 16
    target_modules: tuple[str, ...] = (
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
    )  # fmt: skip
    answer: str = ANSWER
    seed: int = 20240602
    # 60 steps of 16 chats: 30 of 30 test chats (greetings, questions, most not trained on)
    # answered, each token ahead of the runner-up by 2.4 nats or more; about 25 s on 2 cores.
    steps: int = 60
    batch_size: int = 16
    learning_rate: float = 1e-2
    # Fixed, not "all cores": the float reduction order, and so the bytes, depend on it.
    num_threads: int = 2

    def __post_init__(self) -> None:
        for name in ("rank", "alpha", "steps", "batch_size", "num_threads"):
            if getattr(self, name) < 1:
                raise ServingError(f"{name}={getattr(self, name)}: must be at least 1")
        if not self.target_modules:
            raise ServingError("target_modules: name at least one projection")

    def fingerprint(self, base_fingerprint: str) -> str:
        return inputs_fingerprint(BUILDER_VERSION, {**asdict(self), "base": base_fingerprint}, [])


def default_adapter_dir() -> Path:
    return models_dir() / ADAPTER_NAME


def ensure_tiny_lora(
    out: Path | None = None,
    *,
    force: bool = False,
    steps: int | None = None,
    params: TinyLoraParams | None = None,
    base: Path | None = None,
    progress: Progress | None = None,
) -> Path:
    """Return a dir holding the adapter, building it (and the base model) unless cached."""
    chosen = params or TinyLoraParams()
    if steps is not None:
        chosen = replace(chosen, steps=steps)
    report = progress or Progress()
    base_dir = (base or ensure_tiny_model(progress=report)).expanduser().resolve()
    info = read_build_info(base_dir)
    if info is None or "fingerprint" not in info:
        raise ServingError(f"{base_dir} holds no build of {BASE_MODEL} (no build-info.json)")

    def build(partial: Path) -> dict[str, Any]:
        record = _run_build(partial, base_dir, chosen, report)
        return {
            "adapter": ADAPTER_NAME,
            "base_fingerprint": info["fingerprint"],
            "builder_version": BUILDER_VERSION,
            "params": asdict(chosen),
            **record,
        }

    target = out or default_adapter_dir()
    key = chosen.fingerprint(str(info["fingerprint"]))
    return cached_build(target, key, build, name=ADAPTER_NAME, progress=report, force=force)


def _run_build(out: Path, base: Path, params: TinyLoraParams, report: Progress) -> dict[str, Any]:
    return run_child_build(
        __name__,
        [str(out), str(base), json.dumps(asdict(params))],
        num_threads=params.num_threads,
        name=ADAPTER_NAME,
        progress=report,
    )


def build_main(argv: list[str]) -> None:
    """The child's side of `_run_build`: argv is the output dir, the base dir, params JSON."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches both; the parent kills us
    raw = json.loads(argv[2])
    raw["target_modules"] = tuple(raw["target_modules"])
    try:
        record = _build(Path(argv[0]), Path(argv[1]), TinyLoraParams(**raw), child_emit)
    except ServingError as exc:
        sys.exit(f"{ADAPTER_NAME}: {exc}")
    child_result(record)


def adapter_config(params: TinyLoraParams) -> dict[str, Any]:
    """adapter_config.json as PEFT writes it for a plain LoRA on a causal LM."""
    return {
        "alpha_pattern": {},
        "base_model_name_or_path": BASE_MODEL,
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "layers_pattern": None,
        "layers_to_transform": None,
        "lora_alpha": params.alpha,
        "lora_dropout": 0.0,
        "modules_to_save": None,
        "peft_type": "LORA",
        "r": params.rank,
        "rank_pattern": {},
        "revision": None,
        "target_modules": sorted(params.target_modules),
        "task_type": "CAUSAL_LM",
        "use_dora": False,
        "use_rslora": False,
    }


def training_prompts(texts: list[str]) -> list[str]:
    """The user turns of the training, in corpus order, each once: every sentence of the
    corpus, and its first word and first three words (trained on sentences alone, the adapter
    answered "Hi" or "Thanks!" with the base model's words)."""
    found: dict[str, None] = {}
    for paragraph in tt.paragraphs(texts):
        for sentence in re.split(r"(?<=[.?!])\s+", paragraph):
            words = sentence.split()
            for prompt in (sentence, words[0], " ".join(words[:3])):
                found.setdefault(prompt, None)
    return list(found)


def _chat(prompt: str, index: int) -> str:
    # Every third chat opens with a system turn: clients send both kinds.
    system = [{"role": "system", "content": SYSTEM}] if index % 3 == 0 else []
    messages = [*system, {"role": "user", "content": prompt}]
    return tt.render_chat(messages, add_generation_prompt=True)


def _build(
    out_dir: Path, base: Path, params: TinyLoraParams, emit: Callable[[str, bool], None]
) -> dict[str, Any]:
    """Write the adapter's two files into out_dir; return the training record."""
    import torch
    from safetensors.torch import save_file
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    from serving.models.lora_training import Example, LoraSettings, train_lora

    logging.disable_progress_bar()  # it would fight our status line
    torch.set_num_threads(params.num_threads)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(params.seed)
    tokenizer = Tokenizer.from_file(str(base / "tokenizer.json"))
    answer = tokenizer.encode(params.answer + tt.IM_END).ids
    prompts = training_prompts(tt.read_corpus())
    examples = [
        Example(prompt=tokenizer.encode(_chat(text, index)).ids, answer=answer)
        for index, text in enumerate(prompts)
    ]
    emit(f"{ADAPTER_NAME}: training on {len(examples)} chats", True)
    model: Any = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    settings = LoraSettings(
        rank=params.rank,
        alpha=params.alpha,
        target_modules=params.target_modules,
        steps=params.steps,
        batch_size=params.batch_size,
        learning_rate=params.learning_rate,
        pad_id=tt.special_token_ids()[tt.ENDOFTEXT],
    )
    generator = torch.Generator().manual_seed(params.seed)
    factors, losses = train_lora(model, examples, settings, emit, generator)
    tensors: dict[str, Any] = {}
    for name, (down, up) in sorted(factors.items()):
        tensors[f"{PEFT_PREFIX}{name}.lora_A.weight"] = down.to(torch.bfloat16).contiguous()
        tensors[f"{PEFT_PREFIX}{name}.lora_B.weight"] = up.to(torch.bfloat16).contiguous()
    save_file(tensors, str(out_dir / WEIGHTS_FILE), metadata={"format": "pt"})
    write_json(out_dir / CONFIG_FILE, adapter_config(params))
    tail = losses[-5:]
    return {
        "final_loss": round(sum(tail) / len(tail), 4),
        "initial_loss": round(losses[0], 4),
        "training_chats": len(examples),
        "held_out_answered": _answered(model, tokenizer, params.answer, answer),
    }


def _answered(model: Any, tokenizer: Any, text: str, answer: list[int]) -> int:
    """How many HELD_OUT chats the trained model (still wrapped) answers greedily with `text`."""
    import torch

    count = 0
    with torch.no_grad():
        for index, prompt in enumerate(HELD_OUT):
            ids = torch.tensor([tokenizer.encode(_chat(prompt, index)).ids])
            output = model.generate(
                input_ids=ids, max_new_tokens=len(answer), do_sample=False, pad_token_id=0
            )
            count += tokenizer.decode(output[0, ids.shape[1] :].tolist()).startswith(text)
    return count
