"""4-bit group quantization and the AWQ GEMM layout, checked against vLLM's own packer."""

from __future__ import annotations

import pytest
import torch
from vllm.model_executor.layers.quantization.utils.quant_utils import awq_pack

from serving.quantize.awq_math import (
    MAX_Q,
    dequantize,
    fake_quantize,
    group_scales_and_zeros,
    pack_columns,
    quantize_codes,
    quantize_linear,
    unpack_columns,
)


def test_packing_matches_vllms_reference_awq_pack() -> None:
    generator = torch.Generator().manual_seed(1)
    codes = torch.randint(0, MAX_Q + 1, (256, 64), generator=generator, dtype=torch.int32)
    reference = awq_pack(codes, 4, 256, 64)  # vLLM's test helper: the layout its kernels read
    assert torch.equal(pack_columns(codes), reference)
    assert torch.equal(unpack_columns(reference), codes)


def test_all_ones_nibbles_wrap_to_negative_int32() -> None:
    codes = torch.full((1, 8), MAX_Q, dtype=torch.int32)
    assert pack_columns(codes).tolist() == [[-1]]
    assert unpack_columns(torch.tensor([[-1]], dtype=torch.int32)).tolist() == [[MAX_Q] * 8]


def test_quantized_linear_round_trips_to_the_searched_weights() -> None:
    weight = torch.randn(96, 256, generator=torch.Generator().manual_seed(2))
    tensors = quantize_linear(weight, 128)
    assert tensors.qweight.shape == (256, 12) and tensors.qweight.dtype == torch.int32
    assert tensors.qzeros.shape == (2, 12) and tensors.qzeros.dtype == torch.int32
    assert tensors.scales.shape == (2, 96) and tensors.scales.dtype == torch.float16
    restored = dequantize(tensors, 128)
    # The stored tensors give exactly what the scale search measured.
    assert torch.equal(restored, fake_quantize(weight, 128))
    scales, _ = group_scales_and_zeros(weight, 128)
    half_step = scales.repeat_interleave(128, dim=1) / 2
    assert bool(((restored - weight).abs() <= half_step * 1.001 + 1e-6).all())


def test_group_extremes_map_to_the_code_range() -> None:
    weight = torch.tensor([[-1.0, 0.0, 0.5, 2.0] * 32])
    scales, zeros = group_scales_and_zeros(weight, 128)
    codes = quantize_codes(weight, scales, zeros, 128)
    assert codes.min().item() == 0 and codes.max().item() == MAX_Q
    assert zeros.item() == 5.0  # round(1.0 / (3.0 / 15))


def test_constant_group_stays_finite() -> None:
    weight = torch.zeros(8, 128)
    assert torch.isfinite(fake_quantize(weight, 128)).all()
    assert torch.equal(fake_quantize(weight, 128), weight)


def test_bad_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="not a multiple of group size 128"):
        quantize_linear(torch.zeros(8, 100), 128)
    with pytest.raises(ValueError, match="not a multiple of 8"):
        pack_columns(torch.zeros(2, 12, dtype=torch.int32))
