"""4-bit group quantization with zero points, and the AutoAWQ "GEMM" tensor layout.

A linear layer's weight W [out, in] is split along `in` into groups of g channels. Each
(output row, group) gets a scale and an integer zero point so that
    W ~= (q - zero) * scale,  q and zero in 0..15
(asymmetric: the group's min and max map to 0 and 15). The scale is rounded to fp16 before q
is computed, because fp16 is how it is stored: dequantizing the stored tensors gives exactly
the weights the search measured.

On disk (what vLLM's `awq` loader reads, AutoAWQ's GEMM version):
    qweight int32 [in, out/8]     q transposed, 8 output columns per int32
    qzeros  int32 [in/g, out/8]   zero points, packed the same way
    scales  fp16  [in/g, out]
Within an int32, nibble i (bits 4i..4i+3) holds column PACK_ORDER[i] of its 8: the order the
AWQ dequantization kernels unpack in.

Usage: `packed = quantize_linear(weight, group_size=128)`; `dequantize(packed, 128)`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BITS = 4
MAX_Q = (1 << BITS) - 1
PER_INT32 = 32 // BITS
PACK_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


@dataclass(frozen=True)
class AwqTensors:
    """One linear layer in AWQ GEMM layout."""

    qweight: torch.Tensor  # int32 [in, out/8]
    qzeros: torch.Tensor  # int32 [in/g, out/8]
    scales: torch.Tensor  # float16 [in/g, out]


def _grouped(weight: torch.Tensor, group_size: int) -> torch.Tensor:
    out_features, in_features = weight.shape
    if in_features % group_size:
        raise ValueError(f"in_features {in_features} is not a multiple of group size {group_size}")
    return weight.float().reshape(out_features, in_features // group_size, group_size)


def group_scales_and_zeros(
    weight: torch.Tensor, group_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scales (fp16-representable, float32) and zero points (float32), each [out, in/g]."""
    groups = _grouped(weight, group_size)
    low, high = groups.amin(dim=-1), groups.amax(dim=-1)
    # A constant group (high == low) still needs a nonzero scale; 1e-5 keeps q finite.
    scales = ((high - low).clamp(min=1e-5) / MAX_Q).half().float()
    zeros = (-torch.round(low / scales)).clamp(0, MAX_Q)
    return scales, zeros


def quantize_codes(
    weight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int
) -> torch.Tensor:
    """Integer codes q in 0..15, [out, in], for the given per-group scales and zeros."""
    groups = _grouped(weight, group_size)
    q = torch.round(groups / scales[..., None]) + zeros[..., None]
    return q.clamp(0, MAX_Q).reshape(weight.shape).to(torch.int32)


def fake_quantize(weight: torch.Tensor, group_size: int) -> torch.Tensor:
    """W rounded to 4 bits and back, float32: what the served layer computes with."""
    scales, zeros = group_scales_and_zeros(weight, group_size)
    codes = quantize_codes(weight, scales, zeros, group_size).float()
    groups = codes.reshape(_grouped(weight, group_size).shape)
    return ((groups - zeros[..., None]) * scales[..., None]).reshape(weight.shape)


def pack_columns(codes: torch.Tensor) -> torch.Tensor:
    """[k, n] codes 0..15 -> int32 [k, n/8], nibble i of each int32 = column PACK_ORDER[i]."""
    rows, cols = codes.shape
    if cols % PER_INT32:
        raise ValueError(f"{cols} columns: not a multiple of {PER_INT32}")
    blocks = codes.to(torch.int64).reshape(rows, cols // PER_INT32, PER_INT32)
    blocks = blocks[..., list(PACK_ORDER)]
    shifts = torch.arange(PER_INT32, dtype=torch.int64) * BITS
    words = (blocks << shifts).sum(dim=-1)  # 0 .. 2**32 - 1
    return (words - (words >= 2**31).to(torch.int64) * 2**32).to(torch.int32)


def unpack_columns(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of pack_columns: int32 [k, n/8] -> int32 codes [k, n]."""
    words = packed.to(torch.int64) & 0xFFFFFFFF
    shifts = torch.arange(PER_INT32, dtype=torch.int64) * BITS
    nibbles = (words[..., None] >> shifts) & MAX_Q  # [k, n/8, 8] in PACK_ORDER
    columns = torch.empty_like(nibbles)
    columns[..., list(PACK_ORDER)] = nibbles
    return columns.reshape(packed.shape[0], -1).to(torch.int32)


def quantize_linear(weight: torch.Tensor, group_size: int) -> AwqTensors:
    """Quantize W [out, in] and lay it out as vLLM's AWQ loader expects."""
    scales, zeros = group_scales_and_zeros(weight, group_size)
    codes = quantize_codes(weight, scales, zeros, group_size)
    return AwqTensors(
        qweight=pack_columns(codes.t().contiguous()),
        qzeros=pack_columns(zeros.to(torch.int32).t().contiguous()),
        scales=scales.t().contiguous().half(),
    )


def dequantize(tensors: AwqTensors, group_size: int) -> torch.Tensor:
    """W [out, in] float32 back from the stored tensors."""
    codes = unpack_columns(tensors.qweight).float()  # [in, out]
    zeros = unpack_columns(tensors.qzeros).float()  # [in/g, out]
    scales = tensors.scales.float()
    per_row_zeros = zeros.repeat_interleave(group_size, dim=0)
    per_row_scales = scales.repeat_interleave(group_size, dim=0)
    return ((codes - per_row_zeros) * per_row_scales).t().contiguous()
