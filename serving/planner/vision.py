"""Parameter count of the Qwen3-VL / Qwen3.5 vision encoder (`vision_config` in config.json).

vLLM loads the vision tower of a `...ForConditionalGeneration` checkpoint next to the decoder,
so it takes memory even when only text is served. Shapes follow transformers'
`Qwen3_5VisionModel`: a Conv3d patch embedding, a learned position table, `depth` ViT blocks
(LayerNorm, qkv + proj with bias, fc1/fc2 MLP with bias) and one patch merger
(LayerNorm, two linears over `hidden x spatial_merge_size**2` features).
"""

from __future__ import annotations

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
