"""Reading config.json files: Qwen2, Qwen3, Qwen3-MoE, Qwen3.5 (nested, hybrid), AWQ, errors."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from serving.errors import ServingError
from serving.planner.catalog import (
    QWEN3_8B,
    QWEN3_CODER_30B_A3B,
    QWEN25_7B,
    QWEN35_27B,
    resolve_model,
)
from serving.planner.models import FULL, LINEAR

QWEN25_7B_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "max_position_embeddings": 32768,
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 152064,
}

QWEN3_8B_CONFIG: dict[str, Any] = {
    "model_type": "qwen3",
    "attention_bias": False,
    "head_dim": 128,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "max_position_embeddings": 40960,
    "num_attention_heads": 32,
    "num_hidden_layers": 36,
    "num_key_value_heads": 8,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 151936,
}

QWEN35_27B_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3_5ForConditionalGeneration"],
    "model_type": "qwen3_5",
    "tie_word_embeddings": False,
    "text_config": {
        "model_type": "qwen3_5_text",
        "attn_output_gate": True,
        "head_dim": 256,
        "hidden_size": 5120,
        "intermediate_size": 17408,
        "layer_types": ["linear_attention"] * 3 + ["full_attention"],
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 48,
        "linear_value_head_dim": 128,
        "mamba_ssm_dtype": "float32",
        "max_position_embeddings": 262144,
        "num_attention_heads": 24,
        "num_hidden_layers": 4,
        "num_key_value_heads": 4,
        "vocab_size": 248320,
        "dtype": "bfloat16",
    },
    "vision_config": {"depth": 27, "hidden_size": 1152, "out_hidden_size": 5120},
}


# Qwen/Qwen3-Coder-30B-A3B-Instruct's config.json, as published (generation-only fields left out).
QWEN3_CODER_30B_A3B_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "decoder_sparse_step": 1,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "intermediate_size": 5472,
    "max_position_embeddings": 262144,
    "mlp_only_layers": [],
    "model_type": "qwen3_moe",
    "moe_intermediate_size": 768,
    "norm_topk_prob": True,
    "num_attention_heads": 32,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 48,
    "num_key_value_heads": 4,
    "qkv_bias": False,
    "rope_theta": 10000000,
    "shared_expert_intermediate_size": 0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_qk_norm": True,
    "vocab_size": 151936,
}


def _write(tmp_path: Path, config: dict[str, Any]) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return tmp_path


def test_qwen2_config_matches_the_catalog(tmp_path: Path) -> None:
    spec = resolve_model(str(_write(tmp_path, QWEN25_7B_CONFIG)))
    assert replace(spec, name=QWEN25_7B.name) == QWEN25_7B


def test_qwen3_config_matches_the_catalog(tmp_path: Path) -> None:
    spec = resolve_model(str(_write(tmp_path, QWEN3_8B_CONFIG) / "config.json"))
    assert replace(spec, name=QWEN3_8B.name) == QWEN3_8B


def test_qwen35_nested_hybrid_config(tmp_path: Path) -> None:
    spec = resolve_model(str(_write(tmp_path, QWEN35_27B_CONFIG)))
    assert spec.layer_types == (LINEAR, LINEAR, LINEAR, FULL)
    assert spec.full_attention_layers == 1 and spec.is_hybrid
    assert spec.linear == QWEN35_27B.linear
    assert spec.attention_output_gate and spec.qk_norm and not spec.attention_bias
    assert spec.vision_params == QWEN35_27B.vision_params


def test_full_attention_interval_without_layer_types(tmp_path: Path) -> None:
    text = dict(QWEN35_27B_CONFIG["text_config"], num_hidden_layers=8, full_attention_interval=4)
    del text["layer_types"]
    spec = resolve_model(str(_write(tmp_path, {"model_type": "qwen3_next", **text})))
    assert spec.layer_types == (LINEAR, LINEAR, LINEAR, FULL) * 2
    assert spec.linear is not None and spec.linear.recurrent_state_bytes == 4


def test_moe_config(tmp_path: Path) -> None:
    moe = dict(
        QWEN3_8B_CONFIG,
        model_type="qwen3_moe",
        num_experts=128,
        num_experts_per_tok=8,
        moe_intermediate_size=768,
    )
    spec = resolve_model(str(_write(tmp_path, moe)))
    assert spec.moe is not None and spec.moe.num_experts == 128
    assert spec.moe.dense_layers == () and spec.sparse_layers == 36


def test_qwen3_coder_config_matches_the_catalog(tmp_path: Path) -> None:
    spec = resolve_model(str(_write(tmp_path, QWEN3_CODER_30B_A3B_CONFIG)))
    assert replace(spec, name=QWEN3_CODER_30B_A3B.name) == QWEN3_CODER_30B_A3B


def test_moe_layers_with_a_dense_mlp(tmp_path: Path) -> None:
    # vLLM's Qwen MoE layers: dense when listed in mlp_only_layers, or when index + 1 is not a
    # multiple of decoder_sparse_step; indices past the last layer change nothing.
    config = dict(
        QWEN3_CODER_30B_A3B_CONFIG,
        num_hidden_layers=6,
        decoder_sparse_step=2,
        mlp_only_layers=[3, 99],
        shared_expert_intermediate_size=512,
    )
    spec = resolve_model(str(_write(tmp_path, config)))
    assert spec.moe is not None
    assert spec.moe.dense_layers == (0, 2, 3, 4)
    assert (spec.sparse_layers, spec.dense_mlp_layers) == (2, 4)
    assert spec.moe.shared_expert_intermediate == 512


def test_awq_checkpoint_is_planned_as_awq(tmp_path: Path) -> None:
    awq = dict(
        QWEN25_7B_CONFIG,
        quantization_config={"quant_method": "awq", "bits": 4, "group_size": 128},
    )
    spec = resolve_model(str(_write(tmp_path, awq)))
    assert spec.awq_group_size == 128


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {k: v for k, v in QWEN25_7B_CONFIG.items() if k != "vocab_size"},
            "'vocab_size' is missing",
        ),
        (dict(QWEN25_7B_CONFIG, num_hidden_layers="28"), "'num_hidden_layers' must be"),
        (dict(QWEN25_7B_CONFIG, layer_types=["full_attention"]), "'layer_types' must list"),
        (dict(QWEN3_CODER_30B_A3B_CONFIG, decoder_sparse_step=0), "'decoder_sparse_step' must"),
        (dict(QWEN3_CODER_30B_A3B_CONFIG, mlp_only_layers="0"), "'mlp_only_layers' must list"),
        (dict(QWEN3_CODER_30B_A3B_CONFIG, mlp_only_layers=[True]), "'mlp_only_layers' must"),
        (
            {k: v for k, v in QWEN3_CODER_30B_A3B_CONFIG.items() if k != "num_experts_per_tok"},
            "'num_experts_per_tok' is missing",
        ),
    ],
)
def test_bad_config_names_the_field(tmp_path: Path, config: dict[str, Any], message: str) -> None:
    with pytest.raises(ServingError, match=message):
        resolve_model(str(_write(tmp_path, config)))


def test_missing_and_broken_files(tmp_path: Path) -> None:
    with pytest.raises(ServingError, match=r"^--model: .*config\.json does not exist"):
        resolve_model(str(tmp_path))
    (tmp_path / "config.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(ServingError, match=r"^--model: cannot read"):
        resolve_model(str(tmp_path))
