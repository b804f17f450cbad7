"""AWQ's second step: clip each weight group's range where that loses less than it gains.

Rounding a group to 16 levels spends them on the range [min, max]; one outlier weight
stretches it and every other weight in the group gets coarser steps. For each
(output row, group of input channels) this tries max|w| shrunk by 0%, 5%, ... up to
`max_shrink`, clamps, rounds, and keeps the shrink whose partial output (this group's
inputs times this group's weights, on calibration activations) is closest to the unclipped
float one. Shrink 0 is no clipping, so it never does worse on the calibration set.

As in AWQ, q_proj and k_proj are not clipped: their outputs meet in the attention
softmax, where per-output squared error is a poor guide.

Usage: `before, after = clip_linear(linear, x_scaled, group_size=128)` (in place).
"""

from __future__ import annotations

import torch
from torch import nn

from serving.quantize.awq_math import fake_quantize


def _grouped_outputs(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """[rows, out, groups]: each group's contribution to each output."""
    return torch.einsum("rgk,ogk->rog", x, weight)


def clip_linear(
    linear: nn.Linear,
    x: torch.Tensor,
    *,
    group_size: int,
    grid: int = 20,
    max_shrink: float = 0.5,
    max_rows: int = 512,
    rows_per_chunk: int = 64,
) -> tuple[float, float]:
    """Clamp `linear`'s weight groups in place; (error before, after) on the sample."""
    weight = linear.weight.detach().float()
    out_features, in_features = weight.shape
    groups = in_features // group_size
    if x.shape[0] > max_rows:
        x = x[torch.linspace(0, x.shape[0] - 1, max_rows).round().long()]
    x_groups = x.float().reshape(-1, groups, group_size)
    limits = torch.empty(out_features, groups)
    before = after = 0.0
    for start in range(0, out_features, rows_per_chunk):  # bounds memory for wide layers
        w = weight[start : start + rows_per_chunk].reshape(-1, groups, group_size)
        reference = _grouped_outputs(x_groups, w)
        original = w.abs().amax(dim=-1)  # [chunk, groups]
        best = original.clone()
        best_error = torch.full_like(original, float("inf"))
        for step in range(int(max_shrink * grid) + 1):
            limit = original * (1 - step / grid)
            clipped = w.clamp(-limit[..., None], limit[..., None])
            rounded = fake_quantize(clipped.reshape(w.shape[0], -1), group_size)
            error = ((_grouped_outputs(x_groups, rounded.reshape(w.shape)) - reference) ** 2).mean(
                dim=0
            )
            if step == 0:
                before += float(error.sum())
            better = error < best_error
            best_error = torch.where(better, error, best_error)
            best = torch.where(better, limit, best)
        after += float(best_error.sum())
        limits[start : start + w.shape[0]] = best
    with torch.no_grad():
        bound = limits.repeat_interleave(group_size, dim=1).to(linear.weight.dtype)
        linear.weight.copy_(torch.maximum(torch.minimum(linear.weight, bound), -bound))
    scale = out_features * groups
    return before / scale, after / scale
