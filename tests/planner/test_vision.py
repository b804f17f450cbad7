"""The Qwen2.5-VL vision encoder: parameters as transformers builds them, images as its
processor resizes them, and the encoder's share of vLLM's profiling peak."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.planner.activations import activation_estimate, with_vision_encoder
from serving.planner.config_json import spec_from_config
from serving.planner.gpus import get_gpu
from serving.planner.plan import evaluate
from serving.planner.settings import PlanSettings, resolve
from serving.planner.vision import (
    Qwen25VisionConfig,
    encoder_activation,
    encoder_profile_images,
    image_tokens,
    max_image_tokens,
    qwen25_vision_params,
    smart_resize,
)

TINY = Qwen25VisionConfig(depth=2, hidden=64, intermediate=128, out_hidden=128, max_pixels=50176)
QWEN25_VL_7B = Qwen25VisionConfig()  # vision_config of Qwen2.5-VL-7B-Instruct


def transformers_vision_params(config: Qwen25VisionConfig, num_heads: int) -> int:
    import torch
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import (
        Qwen2_5_VisionTransformerPretrainedModel,
    )

    hf = Qwen2_5_VLVisionConfig(
        depth=config.depth,
        hidden_size=config.hidden,
        intermediate_size=config.intermediate,
        num_heads=num_heads,
        in_channels=config.in_channels,
        patch_size=config.patch_size,
        temporal_patch_size=config.temporal_patch_size,
        spatial_merge_size=config.spatial_merge_size,
        out_hidden_size=config.out_hidden,
    )
    with torch.device("meta"):  # shapes only: the 7B encoder allocates nothing
        model = Qwen2_5_VisionTransformerPretrainedModel(hf)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    ("config", "heads"), [(TINY, 2), (QWEN25_VL_7B, 16)], ids=["tiny", "qwen2.5-vl-7b"]
)
def test_parameters_are_what_transformers_builds(config: Qwen25VisionConfig, heads: int) -> None:
    assert qwen25_vision_params(config) == transformers_vision_params(config, heads)


def test_known_encoder_sizes() -> None:
    assert qwen25_vision_params(TINY) == 257_344  # the tiny model's build record
    assert qwen25_vision_params(QWEN25_VL_7B) == 676_550_144


@settings(max_examples=300, deadline=None)
@given(
    height=st.integers(1, 6000),
    width=st.integers(1, 6000),
    max_pixels=st.sampled_from([28 * 28 * 64, 28 * 28 * 1280, 12_845_056]),
)
def test_smart_resize_is_transformers(height: int, width: int, max_pixels: int) -> None:
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import (
        smart_resize as reference,
    )

    kwargs = {"factor": 28, "min_pixels": 56 * 56, "max_pixels": max_pixels}
    try:
        expected = reference(height, width, **kwargs)
    except ValueError:
        with pytest.raises(ValueError, match="aspect ratio"):
            smart_resize(height, width, **kwargs)
        return
    assert smart_resize(height, width, **kwargs) == expected


def test_image_tokens_of_the_tiny_model() -> None:
    # Measured on vLLM serving the tiny model: prompt tokens grew by these + 2.
    sizes = {(56, 56): 4, (100, 60): 8, (300, 200): 54, (1000, 800): 56, (28, 28): 4}
    for (width, height), tokens in sizes.items():
        assert image_tokens(height, width, TINY) == tokens
    assert max_image_tokens(TINY) == 64
    assert max_image_tokens(QWEN25_VL_7B) == 16384


def test_profiling_batch_follows_vllms_budget() -> None:
    def images(**overrides: object) -> int:
        args: dict[str, object] = {
            "max_num_batched_tokens": 2048,
            "max_num_seqs": 8,
            "max_model_len": 2048,
            "images_per_prompt": 4,
        }
        return encoder_profile_images(TINY, **{**args, **overrides})  # type: ignore[arg-type]

    assert images() == 2048 // 64  # the encoder budget binds: 32 images of 64 tokens
    assert images(max_num_seqs=2) == 8  # 2 prompts x 4 images
    assert images(images_per_prompt=0) == 0  # images disabled: no encoder pass
    assert images(images_per_prompt=None, max_num_seqs=1) == 2048 // 64  # vLLM's 999
    # One 16384-token image is more than the budget: vLLM still profiles one.
    assert (
        encoder_profile_images(
            QWEN25_VL_7B,
            max_num_batched_tokens=8192,
            max_num_seqs=256,
            max_model_len=32768,
            images_per_prompt=None,
        )
        == 1
    )


def test_encoder_activation_counts_patches_and_embeddings() -> None:
    one = encoder_activation(TINY, 1, dtype_bytes=2)
    patches = 64 * 4
    assert one.peak_bytes == patches * 2 * (3 * 2 * 14 * 14 + 4 * 64 + max(4 * 64, 3 * 128))
    assert one.output_bytes == 64 * 128 * 2
    assert encoder_activation(TINY, 3, dtype_bytes=2).peak_bytes == 3 * one.peak_bytes


QWEN25_VL_7B_CONFIG = {
    "model_type": "qwen2_5_vl",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "max_position_embeddings": 128000,
    "tie_word_embeddings": False,
    "vision_config": {"depth": 32, "hidden_size": 1280, "intermediate_size": 3420,
                      "in_chans": 3, "out_hidden_size": 3584},
}  # fmt: skip


def test_a_qwen25_vl_plan_counts_the_encoder() -> None:
    spec = spec_from_config(QWEN25_VL_7B_CONFIG, name="Qwen2.5-VL-7B", source="test")
    assert spec.vision == QWEN25_VL_7B and spec.attention_bias
    assert spec.vision_params == 676_550_144
    gpu = get_gpu("h100")
    s = resolve(spec, gpu, PlanSettings(max_model_len=32768, images_per_prompt=4))
    assert s.max_num_batched_tokens and s.max_num_seqs
    text = activation_estimate(
        spec, 1, dtype_bytes=2, max_num_batched_tokens=s.max_num_batched_tokens,
        max_num_seqs=s.max_num_seqs,
    ).peak_bytes  # fmt: skip
    encoder = encoder_activation(QWEN25_VL_7B, 1, dtype_bytes=2)
    expected = max(encoder.peak_bytes, text + encoder.output_bytes)
    assert with_vision_encoder(text, spec, s, dtype_bytes=2) == expected > text
    full = evaluate(spec, gpu, PlanSettings(max_model_len=32768, images_per_prompt=4))
    assert full.activation_bytes == expected
    text_only = evaluate(spec, gpu, PlanSettings(max_model_len=32768, language_model_only=True))
    assert text_only.activation_bytes == text
    no_images = evaluate(spec, gpu, PlanSettings(max_model_len=32768, images_per_prompt=0))
    assert no_images.activation_bytes == text
    assert no_images.weights.total - text_only.weights.total == 2 * spec.vision_params


def test_a_preprocessor_config_sets_the_largest_image() -> None:
    small = {"size": {"shortest_edge": 3136, "longest_edge": 28 * 28 * 64}}
    spec = spec_from_config(QWEN25_VL_7B_CONFIG, name="m", source="test", preprocessor=small)
    assert spec.vision == replace(QWEN25_VL_7B, max_pixels=28 * 28 * 64)
    legacy = spec_from_config(
        QWEN25_VL_7B_CONFIG, name="m", source="test", preprocessor={"max_pixels": 1003520}
    )
    assert legacy.vision is not None and max_image_tokens(legacy.vision) == 1280
