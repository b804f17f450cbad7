"""A tiny Qwen2.5-VL built here: image input served for real without downloading a model.

`ensure_tiny_vl_model()` writes a `Qwen2_5_VLForConditionalGeneration` checkpoint in the
layout of the published Qwen2.5-VL ones (flat text fields plus `vision_config` in config.json;
`visual.*` and `model.*` weights; a Qwen2-VL `preprocessor_config.json`), about 0.9M
parameters, randomly initialised from a fixed seed: its answers are noise, but vLLM loads,
preprocesses, encodes and schedules images exactly as for a 7B Qwen2.5-VL. The tokenizer is
the text model's (trained on the shipped corpus) plus Qwen's vision special tokens, whose ids
config.json names; the chat template is ChatML that renders an image part as
`<|vision_start|><|image_pad|><|vision_end|>`, which vLLM's processor expands to one
`<|image_pad|>` per merged 28x28 patch (`serving.planner.vision.image_tokens`).

Deterministic like the text model (`serving.models.tiny_model`): a fresh interpreter with a
seeded RNG and a fixed thread count, sorted JSON, cached by fingerprint in build-info.json.

Usage: `path = ensure_tiny_vl_model()`; in tests `ensure_tiny_vl_model(tmp)`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import serving
from serving.errors import ServingError
from serving.models import tiny_tokenizer as tt
from serving.models.cached_build import (
    Progress,
    build_record,
    cached_build,
    inputs_fingerprint,
    write_json,
)
from serving.paths import models_dir

# Bump when the builder's code changes what it writes; it is part of the fingerprint.
BUILDER_VERSION = "1"
MODEL_NAME = "qwen2.5-vl-tiny"

VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
VISION_PAD = "<|vision_pad|>"
IMAGE_PAD = "<|image_pad|>"
VIDEO_PAD = "<|video_pad|>"
# Qwen's order; appended after the trained vocabulary, so their ids follow it.
VISION_TOKENS = (VISION_START, VISION_END, VISION_PAD, IMAGE_PAD, VIDEO_PAD)
PREPROCESSOR_CONFIG = "preprocessor_config.json"

# ChatML as Qwen2.5-VL renders it, without its default system turn (so a prompt's tokens are
# exactly its messages'): a string content as is; a list of parts with each image (an OpenAI
# `image_url` part reaches the template as `{"type": "image"}`) as one vision block.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}"
    "{{- message['content'] }}"
    "{%- elif message['content'] %}"
    "{%- for part in message['content'] %}"
    "{%- if part['type'] == 'image' or 'image' in part or 'image_url' in part %}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif part['type'] == 'video' or 'video' in part %}"
    "{{- '<|vision_start|><|video_pad|><|vision_end|>' }}"
    "{%- elif 'text' in part %}"
    "{{- part['text'] }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)
# CLIP's normalisation, as every Qwen2-VL / Qwen2.5-VL preprocessor_config.json has it.
IMAGE_MEAN = (0.48145466, 0.4578275, 0.40821073)
IMAGE_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True, kw_only=True)
class TinyVlParams:
    """Everything that decides the built files besides the corpus and the builder's code.

    The shapes are the smallest vLLM's CPU kernels take: text head_dim 32, mrope sections
    summing to head_dim / 2; the vision side keeps Qwen2.5-VL's patch 14, merge 2, temporal
    patch 2 and window 112 (so the image token rule is the real model's).
    """

    vocab_size: int = 2048  # the tokenizer's training target, as the text model's
    hidden_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    intermediate_size: int = 384
    max_position_embeddings: int = 4096
    rope_theta: float = 1000000.0
    mrope_section: tuple[int, int, int] = (4, 6, 6)  # temporal, height, width rotary pairs
    vision_depth: int = 2
    vision_hidden_size: int = 64
    vision_num_heads: int = 2
    vision_intermediate_size: int = 128
    patch_size: int = 14
    spatial_merge_size: int = 2
    temporal_patch_size: int = 2
    window_size: int = 112  # pixels; windowed blocks attend within 112x112 tiles
    fullatt_block_indexes: tuple[int, ...] = (1,)  # the last block sees the whole image
    # Pixels an image is resized into (smart_resize); 28*28*64 caps an image at 64 tokens,
    # so a few images fit the tiny context.
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 64
    seed: int = 20240601
    # Fixed, not "all cores": the float reduction order, and so the bytes, depend on it.
    num_threads: int = 2

    def __post_init__(self) -> None:
        head_dim, rest = divmod(self.hidden_size, self.num_attention_heads)
        if rest or self.num_attention_heads % self.num_key_value_heads:
            raise ServingError(
                f"hidden_size={self.hidden_size}, num_attention_heads="
                f"{self.num_attention_heads}, num_key_value_heads={self.num_key_value_heads}: "
                "heads must divide hidden_size and KV heads must divide heads"
            )
        if 2 * sum(self.mrope_section) != head_dim:
            raise ServingError(
                f"mrope_section={list(self.mrope_section)}: must sum to head_dim / 2 "
                f"({head_dim // 2})"
            )
        if self.vision_hidden_size % self.vision_num_heads:
            raise ServingError(f"vision_num_heads={self.vision_num_heads}: must divide hidden")
        if any(not 0 <= index < self.vision_depth for index in self.fullatt_block_indexes):
            raise ServingError(f"fullatt_block_indexes={self.fullatt_block_indexes}: no such block")
        if not 0 < self.min_pixels <= self.max_pixels:
            raise ServingError(f"min_pixels={self.min_pixels}: must be in (0, max_pixels]")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def fingerprint(self, corpus: list[Path]) -> str:
        # The builders' code too: the tokenizer and its added tokens are the text model's,
        # changed by its own owners; a rebuild takes seconds.
        builders = sorted(Path(__file__).parent.glob("*.py"))
        return inputs_fingerprint(BUILDER_VERSION, asdict(self), [*builders, *corpus])


def default_model_dir() -> Path:
    return models_dir() / MODEL_NAME


def ensure_tiny_vl_model(
    out: Path | None = None,
    *,
    force: bool = False,
    params: TinyVlParams | None = None,
    progress: Progress | None = None,
) -> Path:
    """Return a dir holding the tiny VL model, building it unless a matching build is there."""
    chosen = params or TinyVlParams()
    report = progress or Progress()
    corpus = tt.corpus_files()
    if not corpus:
        raise ServingError(f"no corpus files in {tt.corpus_dir()}: the package is incomplete")

    def build(partial: Path) -> dict[str, Any]:
        record = _run_build(partial, chosen)
        return {**build_record(BUILDER_VERSION, MODEL_NAME, asdict(chosen), corpus), **record}

    target = out or default_model_dir()
    return cached_build(
        target, chosen.fingerprint(corpus), build, name=MODEL_NAME, progress=report, force=force
    )


def planned_config(params: TinyVlParams) -> dict[str, Any]:
    """The config.json a build writes, without building (for the planner): the corpus fills
    `params.vocab_size`, the text tokenizer's added tokens and the vision tokens follow."""
    from serving.models.chat_template import ADDED_TOKENS

    trained = params.vocab_size + len(ADDED_TOKENS)
    ids = {**tt.special_token_ids(), **vision_token_ids(trained)}
    return qwen2_5_vl_config(params, _padded(trained + len(VISION_TOKENS)), ids)


def _padded(vocab: int) -> int:
    return -(-vocab // 64) * 64  # round up: friendlier matmul shapes


def vision_token_ids(trained_vocab: int) -> dict[str, int]:
    """Ids of the vision tokens, appended after a trained vocabulary of that size."""
    return {token: trained_vocab + index for index, token in enumerate(VISION_TOKENS)}


def qwen2_5_vl_config(params: TinyVlParams, vocab_size: int, ids: dict[str, int]) -> dict[str, Any]:
    """config.json in the form of the published Qwen2.5-VL checkpoints."""
    return {
        "architectures": ["Qwen2_5_VLForConditionalGeneration"],
        "attention_dropout": 0.0,
        "bos_token_id": ids[tt.ENDOFTEXT],
        "eos_token_id": ids[tt.IM_END],
        "hidden_act": "silu",
        "hidden_size": params.hidden_size,
        "image_token_id": ids[IMAGE_PAD],
        "initializer_range": 0.02,
        "intermediate_size": params.intermediate_size,
        "max_position_embeddings": params.max_position_embeddings,
        "max_window_layers": params.num_hidden_layers,
        "model_type": "qwen2_5_vl",
        "num_attention_heads": params.num_attention_heads,
        "num_hidden_layers": params.num_hidden_layers,
        "num_key_value_heads": params.num_key_value_heads,
        "pad_token_id": ids[tt.ENDOFTEXT],
        "rms_norm_eps": 1e-06,
        "rope_scaling": {"mrope_section": list(params.mrope_section), "type": "mrope"},
        "rope_theta": params.rope_theta,
        "sliding_window": None,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "use_sliding_window": False,
        "video_token_id": ids[VIDEO_PAD],
        "vision_config": {
            "depth": params.vision_depth,
            "fullatt_block_indexes": list(params.fullatt_block_indexes),
            "hidden_act": "silu",
            "hidden_size": params.vision_hidden_size,
            "in_channels": 3,
            "intermediate_size": params.vision_intermediate_size,
            "num_heads": params.vision_num_heads,
            "out_hidden_size": params.hidden_size,
            "patch_size": params.patch_size,
            "spatial_merge_size": params.spatial_merge_size,
            "temporal_patch_size": params.temporal_patch_size,
            "tokens_per_second": 2,
            "window_size": params.window_size,
        },
        "vision_end_token_id": ids[VISION_END],
        "vision_start_token_id": ids[VISION_START],
        "vision_token_id": ids[VISION_PAD],
        "vocab_size": vocab_size,
    }


def preprocessor_config(params: TinyVlParams) -> dict[str, Any]:
    """preprocessor_config.json: Qwen2-VL's image processor with this model's pixel range.

    Both spellings of the range: `size` (transformers 5) and min/max_pixels (earlier readers).
    """
    return {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": list(IMAGE_MEAN),
        "image_processor_type": "Qwen2VLImageProcessor",
        "image_std": list(IMAGE_STD),
        "max_pixels": params.max_pixels,
        "merge_size": params.spatial_merge_size,
        "min_pixels": params.min_pixels,
        "patch_size": params.patch_size,
        "processor_class": "Qwen2_5_VLProcessor",
        "resample": 3,  # bicubic
        "rescale_factor": 1 / 255,
        "size": {"longest_edge": params.max_pixels, "shortest_edge": params.min_pixels},
        "temporal_patch_size": params.temporal_patch_size,
    }


def with_vision_tokens(config: dict[str, Any], ids: dict[str, int]) -> dict[str, Any]:
    """The text model's tokenizer_config.json plus the vision tokens and the VL template."""
    added = dict(config["added_tokens_decoder"])
    for token in VISION_TOKENS:
        added[str(ids[token])] = {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
    special = [*config.get("additional_special_tokens", []), *VISION_TOKENS]
    return {
        **config,
        "added_tokens_decoder": added,
        "additional_special_tokens": special,
        "chat_template": CHAT_TEMPLATE,
    }


def _run_build(out_dir: Path, params: TinyVlParams) -> dict[str, Any]:
    """Build in a fresh interpreter (same torch state, same bytes); return its record."""
    env = dict(
        os.environ,
        OMP_NUM_THREADS=str(params.num_threads),
        OMP_WAIT_POLICY="PASSIVE",
        TOKENIZERS_PARALLELISM="false",
    )
    # Appended, not prepended: finds this checkout when it is not installed, shadows nothing.
    code = (
        "import sys; sys.path.append(sys.argv[1]); "
        "from serving.models.tiny_vl_model import build_main; build_main(sys.argv[2:])"
    )
    package_root = str(Path(serving.__file__).resolve().parent.parent)
    params_json = json.dumps(asdict(params))
    command = [sys.executable, "-c", code, package_root, str(out_dir), params_json]
    done = subprocess.run(
        command, env=env, stdout=subprocess.PIPE, text=True, encoding="utf-8", check=False
    )
    if done.returncode != 0:
        raise ServingError(f"building {MODEL_NAME} failed (exit {done.returncode}); see above")
    record: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return record


def build_main(argv: list[str]) -> None:
    """The child's side of `_run_build`: build into argv[0] with the params JSON in argv[1]."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches both; the parent kills us
    raw = json.loads(argv[1])
    for name in ("mrope_section", "fullatt_block_indexes"):
        raw[name] = tuple(raw[name])
    record = _build(Path(argv[0]), TinyVlParams(**raw))
    print(json.dumps(record), flush=True)


def _build(out_dir: Path, params: TinyVlParams) -> dict[str, Any]:
    """Write every model file but build-info into out_dir; return the build record."""
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    tokenizer = tt.train_tokenizer(tt.read_corpus(), vocab_size=params.vocab_size)
    trained = tokenizer.get_vocab_size()
    tokenizer.add_special_tokens(list(VISION_TOKENS))
    ids = {**tt.special_token_ids(), **vision_token_ids(trained)}
    for token, index in ids.items():
        if tokenizer.token_to_id(token) != index:
            raise ServingError(f"{token}: id {tokenizer.token_to_id(token)}, expected {index}")
    max_length = params.max_position_embeddings
    tt.save_tokenizer(tokenizer, out_dir, model_max_length=max_length)
    # What the text model's tokenizer files say, extended: one owner for the shared part.
    config_path = out_dir / "tokenizer_config.json"
    text_config = json.loads(config_path.read_text(encoding="utf-8"))
    write_json(config_path, with_vision_tokens(text_config, ids))
    vocab_size = _padded(tokenizer.get_vocab_size())
    config = qwen2_5_vl_config(params, vocab_size, ids)
    write_json(out_dir / "config.json", config)
    write_json(out_dir / PREPROCESSOR_CONFIG, preprocessor_config(params))
    eos = [ids[tt.IM_END], ids[tt.ENDOFTEXT]]
    pad = ids[tt.ENDOFTEXT]
    write_json(
        out_dir / "generation_config.json",
        {"bos_token_id": pad, "eos_token_id": eos, "pad_token_id": pad},
    )

    torch.set_num_threads(params.num_threads)
    torch.manual_seed(params.seed)
    model = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(**config))
    tensors = {}
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight":
            continue  # tied to the input embedding: checkpoints store that one only
        tensors[_published_name(name)] = tensor.detach().to(torch.bfloat16).contiguous()
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    vision = sum(p.numel() for n, p in model.named_parameters() if ".visual." in f".{n}")
    return {
        "parameters": sum(p.numel() for p in model.parameters()),
        "vision_parameters": vision,
        "token_ids": ids,
        "vocab_size": vocab_size,
    }


def _published_name(name: str) -> str:
    """transformers 5's module names -> the published checkpoints' (`visual.*`, `model.*`)."""
    for new, old in (("model.visual.", "visual."), ("model.language_model.", "model.")):
        if name.startswith(new):
            return old + name.removeprefix(new)
    return name
