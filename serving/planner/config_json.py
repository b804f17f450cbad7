"""Read a Hugging Face `config.json` (Qwen2, Qwen3, Qwen3-MoE, Qwen3-Next, Qwen3.5) into a spec.

Multimodal checkpoints (`Qwen3_5ForConditionalGeneration`) nest the decoder under
`text_config` and the vision tower under `vision_config`; both are read. Qwen2.5-VL keeps the
decoder's fields at the top level; its encoder's largest image comes from the pixel range of
preprocessor_config.json beside config.json. Hybrid layouts come
from `layer_types` or, failing that, `full_attention_interval` (default 4, as transformers).
MoE configs (`num_experts` > 0) add the experts, a shared expert if any, and which layers keep
a dense MLP (`decoder_sparse_step`, `mlp_only_layers`, as vLLM's Qwen MoE classes read them).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from serving.errors import ServingError
from serving.planner.models import (
    FULL,
    LINEAR,
    GatedDeltaNetSpec,
    LayerKind,
    ModelSpec,
    MoeSpec,
    dense_mlp_indices,
    hybrid_layer_types,
)
from serving.planner.vision import (
    Qwen25VisionConfig,
    VisionConfig,
    qwen25_vision_params,
    vision_encoder_params,
)

PREPROCESSOR_CONFIG = "preprocessor_config.json"
_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
# Qwen2 decoders (q/k/v bias); Qwen2-VL and Qwen2.5-VL name theirs so at the top level too.
_QWEN2_TYPES = {"qwen2", "qwen2_moe", "qwen2_5_vl", "qwen2_5_vl_text", "qwen2_vl", "qwen2_vl_text"}


class _Fields:
    """Typed access to one JSON object, with errors that name the file and the field."""

    def __init__(self, data: Mapping[str, Any], source: str) -> None:
        self.data = data
        self.source = source

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def integer(self, key: str, default: int | None = None) -> int:
        value = self.data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            if value is None:
                raise ServingError(f"{self.source}: field '{key}' is missing")
            raise ServingError(f"{self.source}: field '{key}' must be a non-negative integer")
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            raise ServingError(f"{self.source}: field '{key}' must be true or false")
        return value

    def text(self, key: str, default: str) -> str:
        value = self.data.get(key, default)
        return value if isinstance(value, str) else default


def _layer_types(fields: _Fields, layers: int) -> tuple[LayerKind, ...]:
    raw = fields.data.get("layer_types")
    if raw is not None:
        if not isinstance(raw, list) or len(raw) != layers:
            raise ServingError(
                f"{fields.source}: field 'layer_types' must list one entry per layer ({layers})"
            )
        kinds: list[LayerKind] = []
        for entry in raw:
            if entry not in (FULL, LINEAR):
                raise ServingError(f"{fields.source}: field 'layer_types': unknown {entry!r}")
            kinds.append(FULL if entry == FULL else LINEAR)
        return tuple(kinds) if LINEAR in kinds else ()
    if fields.has("linear_num_value_heads") or fields.has("full_attention_interval"):
        return hybrid_layer_types(layers, fields.integer("full_attention_interval", 4))
    return ()


def _linear_spec(fields: _Fields) -> GatedDeltaNetSpec:
    ssm_dtype = fields.text("mamba_ssm_dtype", "")
    return GatedDeltaNetSpec(
        key_heads=fields.integer("linear_num_key_heads"),
        value_heads=fields.integer("linear_num_value_heads"),
        key_head_dim=fields.integer("linear_key_head_dim"),
        value_head_dim=fields.integer("linear_value_head_dim"),
        conv_kernel=fields.integer("linear_conv_kernel_dim", 4),
        recurrent_state_bytes=_DTYPE_BYTES.get(ssm_dtype),
    )


def _moe_spec(fields: _Fields, layers: int) -> MoeSpec | None:
    experts = fields.data.get("num_experts") or 0
    if not experts:
        return None
    step = fields.integer("decoder_sparse_step", 1)
    if step == 0:
        raise ServingError(f"{fields.source}: field 'decoder_sparse_step' must be > 0")
    mlp_only = fields.data.get("mlp_only_layers") or []
    if not isinstance(mlp_only, list) or not all(
        isinstance(index, int) and not isinstance(index, bool) for index in mlp_only
    ):
        raise ServingError(f"{fields.source}: field 'mlp_only_layers' must list layer indices")
    return MoeSpec(
        num_experts=fields.integer("num_experts"),
        experts_per_token=fields.integer("num_experts_per_tok"),
        expert_intermediate=fields.integer("moe_intermediate_size"),
        shared_expert_intermediate=fields.integer("shared_expert_intermediate_size", 0),
        dense_layers=dense_mlp_indices(layers, step, tuple(mlp_only)),
    )


def _vision_params(raw: Any, text_hidden: int, source: str) -> int:
    if not isinstance(raw, Mapping) or not raw:
        return 0
    v = _Fields(raw, f"{source} vision_config")
    defaults = VisionConfig()
    deepstack = raw.get("deepstack_visual_indexes") or []
    return vision_encoder_params(
        VisionConfig(
            depth=v.integer("depth", defaults.depth),
            hidden=v.integer("hidden_size", defaults.hidden),
            intermediate=v.integer("intermediate_size", defaults.intermediate),
            in_channels=v.integer("in_channels", defaults.in_channels),
            patch_size=v.integer("patch_size", defaults.patch_size),
            temporal_patch_size=v.integer("temporal_patch_size", defaults.temporal_patch_size),
            spatial_merge_size=v.integer("spatial_merge_size", defaults.spatial_merge_size),
            out_hidden=v.integer("out_hidden_size", text_hidden),
            num_position_embeddings=v.integer(
                "num_position_embeddings", defaults.num_position_embeddings
            ),
            deepstack_mergers=len(deepstack) if isinstance(deepstack, list) else 0,
        )
    )


def _qwen25_vision(
    raw: Any, text_hidden: int, preprocessor: Mapping[str, Any] | None, source: str
) -> Qwen25VisionConfig | None:
    """A Qwen2.5-VL `vision_config`, with the pixel range of preprocessor_config.json."""
    if not isinstance(raw, Mapping) or not raw:
        return None
    v = _Fields(raw, f"{source} vision_config")
    d = Qwen25VisionConfig()
    pixels = _Fields(preprocessor or {}, f"{source} preprocessor_config")
    size = (preprocessor or {}).get("size")
    edges = _Fields(size if isinstance(size, Mapping) else {}, f"{source} preprocessor size")
    return Qwen25VisionConfig(
        depth=v.integer("depth", d.depth),
        hidden=v.integer("hidden_size", d.hidden),
        intermediate=v.integer("intermediate_size", d.intermediate),
        # Published configs say in_chans; transformers 5 writes in_channels.
        in_channels=v.integer("in_channels", v.integer("in_chans", d.in_channels)),
        patch_size=v.integer("patch_size", d.patch_size),
        temporal_patch_size=v.integer("temporal_patch_size", d.temporal_patch_size),
        spatial_merge_size=v.integer("spatial_merge_size", d.spatial_merge_size),
        out_hidden=v.integer("out_hidden_size", text_hidden),
        min_pixels=edges.integer("shortest_edge", pixels.integer("min_pixels", d.min_pixels)),
        max_pixels=edges.integer("longest_edge", pixels.integer("max_pixels", d.max_pixels)),
    )


def _awq_group_size(data: Mapping[str, Any], source: str) -> int | None:
    quant = data.get("quantization_config")
    if not isinstance(quant, Mapping) or str(quant.get("quant_method", "")).lower() != "awq":
        return None
    return _Fields(quant, f"{source} quantization_config").integer("group_size", 128)


def spec_from_config(
    data: Mapping[str, Any],
    *,
    name: str,
    source: str,
    preprocessor: Mapping[str, Any] | None = None,
) -> ModelSpec:
    """Build a spec from the parsed contents of a config.json (and of the checkpoint's
    preprocessor_config.json, whose pixel range sizes a Qwen2.5-VL encoder's largest image)."""
    text_raw = data.get("text_config")
    text = _Fields(text_raw if isinstance(text_raw, Mapping) else data, source)
    model_type = text.text("model_type", "") or _Fields(data, source).text("model_type", "")
    layers = text.integer("num_hidden_layers")
    hidden = text.integer("hidden_size")
    heads = text.integer("num_attention_heads")
    if heads == 0 or layers == 0:
        raise ServingError(
            f"{source}: fields 'num_attention_heads', 'num_hidden_layers' must be > 0"
        )
    layer_types = _layer_types(text, layers)
    gated_default = model_type.startswith(("qwen3_next", "qwen3_5"))
    top = _Fields(data, source)
    tied = text.data.get("tie_word_embeddings", top.data.get("tie_word_embeddings", False))
    dtype = text.text("torch_dtype", text.text("dtype", top.text("torch_dtype", "bfloat16")))
    qwen25_vision = None
    if top.text("model_type", "") == "qwen2_5_vl":
        qwen25_vision = _qwen25_vision(data.get("vision_config"), hidden, preprocessor, source)
    return ModelSpec(
        name=name,
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=text.integer("num_key_value_heads", heads),
        head_dim=text.integer("head_dim", hidden // heads),
        intermediate=text.integer("intermediate_size", 0),
        vocab=text.integer("vocab_size"),
        tied_embeddings=bool(tied),
        max_positions=text.integer("max_position_embeddings"),
        attention_bias=text.flag("attention_bias", model_type in _QWEN2_TYPES),
        qk_norm=model_type.startswith("qwen3"),
        lora_embeddings=model_type.startswith("qwen3"),
        attention_output_gate=text.flag("attn_output_gate", gated_default),
        layer_types=layer_types,
        linear=_linear_spec(text) if layer_types else None,
        moe=_moe_spec(text, layers),
        vision_params=(
            qwen25_vision_params(qwen25_vision)
            if qwen25_vision is not None
            else _vision_params(data.get("vision_config"), hidden, source)
        ),
        vision=qwen25_vision,
        dtype=dtype if dtype in _DTYPE_BYTES else "bfloat16",
        awq_group_size=_awq_group_size(data, source),
    )


def load_config_dir(path: Path) -> ModelSpec:
    """Read `path/config.json` (or `path` itself when it is the file)."""
    file = path if path.name == "config.json" else path / "config.json"
    name = file.parent.name or str(file.parent)
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ServingError(f"--model: {file} does not exist") from None
    except (OSError, ValueError) as exc:
        raise ServingError(f"--model: cannot read {file}: {exc}".replace("\n", " ")) from None
    if not isinstance(data, Mapping):
        raise ServingError(f"--model: {file} is not a JSON object")
    return spec_from_config(
        data, name=name, source=str(file), preprocessor=_preprocessor(file.parent)
    )


def _preprocessor(directory: Path) -> Mapping[str, Any] | None:
    """preprocessor_config.json beside config.json, if the checkpoint has one."""
    try:
        data = json.loads((directory / PREPROCESSOR_CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, Mapping) else None
