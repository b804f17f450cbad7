"""Clipping search: never worse than no clipping, and it trims a lone outlier weight."""

from __future__ import annotations

import torch
from torch import nn

from serving.quantize.awq_clip import clip_linear
from serving.quantize.awq_math import fake_quantize


def linear_with(weight: torch.Tensor) -> nn.Linear:
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    with torch.no_grad():
        layer.weight.copy_(weight)
    return layer


def test_an_outlier_weight_is_clipped_and_the_error_falls() -> None:
    generator = torch.Generator().manual_seed(7)
    weight = torch.randn(16, 256, generator=generator) * 0.02
    weight[3, 5] = 0.5  # one weight 25 sigma out: it stretches its group's 16 levels
    x = torch.randn(300, 256, generator=generator)
    layer = linear_with(weight)
    before, after = clip_linear(layer, x, group_size=128)
    assert after < before
    assert layer.weight[3, 5] < 0.5  # trimmed
    # Groups without an outlier keep most of their range.
    assert torch.allclose(layer.weight[0], weight[0], atol=0.02)
    # The clipped layer, rounded, is closer to the float layer's outputs than plain rounding.
    reference = x @ weight.t()
    plain = ((x @ fake_quantize(weight, 128).t() - reference) ** 2).mean()
    clipped = ((x @ fake_quantize(layer.weight.detach(), 128).t() - reference) ** 2).mean()
    assert clipped < plain


def test_clipping_never_worsens_the_calibration_error() -> None:
    generator = torch.Generator().manual_seed(8)
    for _ in range(3):
        weight = torch.randn(70, 128, generator=generator)  # 70 rows: chunks of 64 and 6
        layer = linear_with(weight)
        before, after = clip_linear(
            layer, torch.randn(50, 128, generator=generator), group_size=64, rows_per_chunk=64
        )
        assert after <= before
        assert bool((layer.weight.abs() <= weight.abs() + 1e-7).all())  # only ever shrinks
