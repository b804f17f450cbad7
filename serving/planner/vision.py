"""Vision encoders of Qwen VL checkpoints: their parameters, image tokens and activation peak.
vLLM loads the vision tower next to the decoder, so it takes memory even when only text is
served (docs/capacity.md, how the numbers are computed).

Layouts, as transformers builds them:
- Qwen3-VL / Qwen3.5 (`VisionConfig`, `Qwen3_5VisionModel`): Conv3d patch embedding with
  bias, a learned position table, `depth` LayerNorm ViT blocks (biased qkv, proj, fc1/fc2)
  and one merger over `hidden x spatial_merge_size**2` features, plus Qwen3-VL's deepstack
  mergers;
- Qwen2.5-VL (`Qwen25VisionConfig`, `Qwen2_5_VisionTransformerPretrainedModel`): Conv3d
  without bias, rotary positions, `depth` RMSNorm blocks (biased qkv, proj and gated SiLU
  MLP) and an RMSNorm merger.
Image tokens follow `smart_resize` (docs/images.md): one per (patch x merge)^2 pixels, plus
`<|vision_start|>` and `<|vision_end|>`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class VisionConfig:
    depth: int = 27
    hidden: int = 1152
    intermediate: int = 4304
    in_channels: int = 3
    patch_size: int = 16
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    out_hidden: int = 3584  # the decoder's hidden size
    num_position_embeddings: int = 2304
    deepstack_mergers: int = 0  # Qwen3-VL: extra mergers for deepstack layers


def _linear(inputs: int, outputs: int) -> int:
    return inputs * outputs + outputs


def vision_encoder_params(config: VisionConfig) -> int:
    """Number of parameters in the vision encoder."""
    h = config.hidden
    patch = config.in_channels * config.temporal_patch_size * config.patch_size**2
    patch_embed = _linear(patch, h)
    positions = config.num_position_embeddings * h
    block = (
        2 * (2 * h)  # norm1, norm2 (LayerNorm weight + bias)
        + _linear(h, 3 * h)  # qkv
        + _linear(h, h)  # proj
        + _linear(h, config.intermediate)  # fc1
        + _linear(config.intermediate, h)  # fc2
    )
    merged = h * config.spatial_merge_size**2
    merger = 2 * h + _linear(merged, merged) + _linear(merged, config.out_hidden)
    deepstack = config.deepstack_mergers * (
        2 * merged + _linear(merged, merged) + _linear(merged, config.out_hidden)
    )
    return patch_embed + positions + config.depth * block + merger + deepstack


@dataclass(frozen=True, kw_only=True)
class Qwen25VisionConfig:
    """`vision_config` of a Qwen2.5-VL checkpoint (defaults: Qwen2.5-VL-7B-Instruct's)."""

    depth: int = 32
    hidden: int = 1280
    intermediate: int = 3420
    in_channels: int = 3
    patch_size: int = 14
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    out_hidden: int = 3584  # the decoder's hidden size
    # The image processor's pixel range (the published checkpoints' preprocessor_config.json:
    # up to 16384 tokens an image).
    min_pixels: int = 56 * 56
    max_pixels: int = 12_845_056


def qwen25_vision_params(config: Qwen25VisionConfig) -> int:
    """Number of parameters in a Qwen2.5-VL vision encoder."""
    h = config.hidden
    patch = config.in_channels * config.temporal_patch_size * config.patch_size**2 * h
    block = (
        2 * h  # norm1, norm2 (RMSNorm weight)
        + _linear(h, 3 * h)  # qkv
        + _linear(h, h)  # proj
        + 2 * _linear(h, config.intermediate)  # gate_proj, up_proj
        + _linear(config.intermediate, h)  # down_proj
    )
    merged = h * config.spatial_merge_size**2
    merger = h + _linear(merged, merged) + _linear(merged, config.out_hidden)
    return patch + config.depth * block + merger


def smart_resize(
    height: int, width: int, *, factor: int, min_pixels: int, max_pixels: int
) -> tuple[int, int]:
    """The size Qwen2-VL's image processor resizes an image to (transformers' smart_resize)."""
    if max(height, width) > 200 * min(height, width):
        raise ValueError(f"{width}x{height}: aspect ratio over 200, the processor refuses it")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def image_tokens(height: int, width: int, config: Qwen25VisionConfig) -> int:
    """`<|image_pad|>` tokens one image of this size takes in the prompt (the two vision
    start/end tokens around them come from the chat template, not counted here)."""
    unit = config.patch_size * config.spatial_merge_size
    h_bar, w_bar = smart_resize(
        height,
        width,
        factor=unit,
        min_pixels=config.min_pixels,
        max_pixels=config.max_pixels,
    )
    return (h_bar // unit) * (w_bar // unit)


def max_image_tokens(config: Qwen25VisionConfig) -> int:
    """Tokens of the largest image, as vLLM sizes it for profiling: max_pixels // 28**2
    (`get_image_size_with_most_features` factors that count into a height and a width)."""
    unit = config.patch_size * config.spatial_merge_size
    return config.max_pixels // (unit * unit)


# vLLM's default for a modality that limit_mm_per_prompt does not name.
DEFAULT_ITEMS_PER_PROMPT = 999


def encoder_profile_images(
    config: Qwen25VisionConfig,
    *,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    max_model_len: int,
    images_per_prompt: int | None,
    chunked_prefill: bool = True,
) -> int:
    """Images of the largest size in the dummy batch vLLM's start-up profiling encodes.

    As `MultiModalBudget._get_max_items` (vllm/multimodal/encoder_budget.py): the encoder
    budget is max(max_num_batched_tokens, tokens of one image); at most that many tokens'
    worth of images, and at most what max_num_seqs prompts may carry.
    """
    per_item = max_image_tokens(config)
    if per_item == 0 or images_per_prompt == 0:
        return 0
    limit = DEFAULT_ITEMS_PER_PROMPT if images_per_prompt is None else images_per_prompt
    by_encoder = max(max_num_batched_tokens, per_item) // per_item
    per_prompt = max(1, min(limit, max_model_len // per_item))
    requests = max_num_seqs
    if not chunked_prefill:
        requests = min(requests, max_num_batched_tokens // per_item)
    return max(1, min(by_encoder, requests * per_prompt))


@dataclass(frozen=True)
class EncoderActivation:
    """Bytes of vLLM's encoder profiling pass (an ESTIMATE, like the decoder's)."""

    images: int
    peak_bytes: int  # while the encoder runs over the dummy batch
    output_bytes: int  # its embeddings, kept in the encoder cache during the decoder's pass


def encoder_activation(
    config: Qwen25VisionConfig, images: int, *, dtype_bytes: int
) -> EncoderActivation:
    """Peak bytes of one encoder pass over `images` images of the largest size, one GPU.

    vLLM encodes the dummy batch as one sequence of patches (4 per image token): the pixel
    patches (in x temporal x patch**2 values each), then per patch, as for the decoder,
    4 x hidden (residual, normed input, block output, next input) plus the widest
    intermediate (qkv + attention output, or gate + up + activated MLP). Attention runs
    per window or per image with flash/varlen kernels on GPUs, so no seq x seq matrix is
    counted. The merger's outputs (one out_hidden row per image token) stay in the encoder
    cache while vLLM then profiles the decoder: they add to the decoder's peak.
    """
    tokens = images * max_image_tokens(config)
    patches = tokens * config.spatial_merge_size**2
    h = config.hidden
    pixels = config.in_channels * config.temporal_patch_size * config.patch_size**2
    widest = max(3 * h + h, 3 * config.intermediate)
    peak = patches * dtype_bytes * (pixels + 4 * h + widest)
    outputs = tokens * config.out_hidden * dtype_bytes
    return EncoderActivation(images=images, peak_bytes=peak, output_bytes=outputs)
