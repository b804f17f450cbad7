"""Turn a Qwen2/Qwen3 dense checkpoint into an AWQ 4-bit checkpoint that vLLM serves.

Steps: tokenize calibration text with the model's own tokenizer; run it through the model
once, recording each linear group's inputs; search and fold AWQ scales (awq_search); search
each group's clipping range (awq_clip); round every decoder linear layer to 4 bits with zero
points in groups of `group_size` input channels and write it in the AutoAWQ GEMM layout
(awq_math); keep embeddings, norms and the LM head in the source dtype; copy the tokenizer
and configs, adding `quantization_config`.

The whole model is loaded in float32 on the CPU: right for the tiny model and for a 7B on a
large host; a 27B wants a GPU machine and a maintained tool (llm-compressor, AutoAWQ).

Usage: `record = quantize_checkpoint(src, out, AwqParams(), texts, emit)` writes `out` and
returns what it did (per-group errors, parameters) for build-info.json.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from serving.errors import ServingError
from serving.models.cached_build import write_json

SUPPORTED_ARCHITECTURES = ("Qwen2ForCausalLM", "Qwen3ForCausalLM")
GROUP_SIZES = (32, 64, 128)  # what vLLM's AWQ kernels take
WEIGHT_FILES = ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.bin.index.json")
NOT_COPIED = {"config.json", "build-info.json"}
LINEARS = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)

Emit = Callable[[str], None]


@dataclass(frozen=True, kw_only=True)
class AwqParams:
    """What decides the quantized files besides the source model and calibration text."""

    group_size: int = 128
    samples: int = 32  # calibration sequences
    seq_len: int = 256  # tokens per sequence
    max_rows: int = 2048  # activation rows kept per group for the error measurement
    grid: int = 20  # exponents tried: 0, 1/grid, ..., (grid-1)/grid
    clip: bool = True  # also search each group's clipping range (awq_clip)
    num_threads: int = 2  # fixed: the float reduction order, and so the files, depend on it

    def __post_init__(self) -> None:
        if self.group_size not in GROUP_SIZES:
            raise ServingError(f"group_size={self.group_size}: must be one of {GROUP_SIZES}")
        for name in ("samples", "seq_len", "max_rows", "grid", "num_threads"):
            if getattr(self, name) < 1:
                raise ServingError(f"{name}={getattr(self, name)}: must be at least 1")


def read_config(src: Path) -> dict[str, Any]:
    """The source config.json, checked to be a dense Qwen we can quantize."""
    try:
        config: dict[str, Any] = json.loads((src / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ServingError(f"{src}: no readable config.json ({exc})") from exc
    architectures = config.get("architectures") or []
    if not set(architectures) & set(SUPPORTED_ARCHITECTURES):
        raise ServingError(
            f"{src}: architectures {architectures} not supported "
            f"(AWQ here takes {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    if config.get("quantization_config"):
        raise ServingError(f"{src}: already quantized ({config['quantization_config']})")
    return config


def check_shapes(config: dict[str, Any], group_size: int) -> None:
    """Every linear's input width must be a whole number of groups."""
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    inputs = {
        "hidden_size": config["hidden_size"],
        "num_attention_heads x head_dim": config["num_attention_heads"] * head_dim,
        "intermediate_size": config["intermediate_size"],
    }
    for name, width in inputs.items():
        if width % group_size:
            raise ServingError(f"{name}={width}: not a multiple of group size {group_size}")


def calibration_batches(src: Path, texts: Sequence[str], params: AwqParams) -> list[Any]:
    """`samples` token sequences of `seq_len`, evenly spread over the tokenized text."""
    import torch
    from tokenizers import Tokenizer

    tokenizer_file = src / "tokenizer.json"
    if not tokenizer_file.exists():
        raise ServingError(f"{src}: no tokenizer.json to tokenize calibration text with")
    stream = Tokenizer.from_file(str(tokenizer_file)).encode("\n\n".join(texts)).ids
    if len(stream) < params.seq_len:
        raise ServingError(
            f"calibration text is {len(stream)} tokens: shorter than seq_len={params.seq_len}"
        )
    last_start = len(stream) - params.seq_len
    starts = sorted(
        {round(i * last_start / max(1, params.samples - 1)) for i in range(params.samples)}
    )
    return [torch.tensor([stream[s : s + params.seq_len]]) for s in starts]


def quantize_checkpoint(
    src: Path, out: Path, params: AwqParams, texts: Sequence[str], emit: Emit
) -> dict[str, Any]:
    """Write the AWQ checkpoint of `src` into the (empty) directory `out`."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM
    from transformers.utils.logging import disable_progress_bar

    from serving.quantize.awq_clip import clip_linear
    from serving.quantize.awq_math import quantize_linear
    from serving.quantize.awq_search import capture_inputs, decoder_scale_groups, search_and_apply

    config = read_config(src)
    check_shapes(config, params.group_size)
    source_dtype = _source_dtype(config)
    torch.set_num_threads(params.num_threads)
    emit(f"AWQ: loading {src}")
    disable_progress_bar()  # our status line reports progress
    model = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32)
    model.train(False)  # inference mode: no dropout
    layers = list(model.get_submodule("model.layers").children())
    groups = [
        group
        for index, layer in enumerate(layers)
        for group in decoder_scale_groups(f"model.layers.{index}", layer)
    ]
    batches = calibration_batches(src, texts, params)
    emit(f"AWQ: calibrating on {len(batches)} x {params.seq_len} tokens")
    stats = capture_inputs(model, groups, batches, max_rows=params.max_rows)
    results = []
    for number, group in enumerate(groups, start=1):
        results.append(search_and_apply(group, stats[group.key], group_size=params.group_size))
        emit(f"AWQ: scale search {number}/{len(groups)}")
    clip_before = clip_after = 0.0
    if params.clip:
        for number, (group, result) in enumerate(zip(groups, results, strict=True), start=1):
            scaled_inputs = stats[group.key].sample() / result.scales  # what the layer now sees
            for linear in group.clipped:
                before, after = clip_linear(linear, scaled_inputs, group_size=params.group_size)
                clip_before, clip_after = clip_before + before, clip_after + after
            emit(f"AWQ: clipping search {number}/{len(groups)}")
    emit("AWQ: packing 4-bit weights")
    tensors: dict[str, Any] = {}
    quantized = {f"model.layers.{i}.{name}" for i in range(len(layers)) for name in LINEARS}
    for name, tensor in model.state_dict().items():
        module, _, kind = name.rpartition(".")
        if module in quantized and kind == "weight":
            packed = quantize_linear(tensor, params.group_size)
            tensors[f"{module}.qweight"] = packed.qweight
            tensors[f"{module}.qzeros"] = packed.qzeros
            tensors[f"{module}.scales"] = packed.scales
        elif name == "lm_head.weight" and config.get("tie_word_embeddings"):
            continue  # tied to the embedding: the checkpoint stores that once
        else:
            tensors[name] = tensor.detach().to(source_dtype)
    save_file(
        {name: t.contiguous() for name, t in tensors.items()},
        str(out / "model.safetensors"),
        metadata={"format": "pt"},
    )
    _copy_side_files(src, out)
    write_json(out / "config.json", {**config, "quantization_config": quantization_config(params)})
    return {
        "awq_params": asdict(params),
        "groups": [result.summary() for result in results],
        "rtn_error": sum(r.rtn_error for r in results),
        "awq_error": sum(r.awq_error for r in results),
        "clip_error_before": clip_before,
        "clip_error_after": clip_after,
        "calibration_tokens": len(batches) * params.seq_len,
    }


def _source_dtype(config: dict[str, Any]) -> Any:
    """The checkpoint's 16/32-bit dtype (`torch_dtype`, or `dtype` in newer configs)."""
    import torch

    name = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    dtypes = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
    if name not in dtypes:
        raise ServingError(f"config.json torch_dtype {name!r}: expected one of {', '.join(dtypes)}")
    return dtypes[name]


def quantization_config(params: AwqParams) -> dict[str, Any]:
    """The config.json block vLLM reads to pick its AWQ loader (AutoAWQ's keys)."""
    return {
        "quant_method": "awq",
        "bits": 4,
        "group_size": params.group_size,
        "zero_point": True,
        "version": "gemm",
        "modules_to_not_convert": None,
    }


def _copy_side_files(src: Path, out: Path) -> None:
    weights = {path for pattern in WEIGHT_FILES for path in src.glob(pattern)}
    for path in sorted(src.iterdir()):
        if path.is_file() and path not in weights and path.name not in NOT_COPIED:
            shutil.copyfile(path, out / path.name)
