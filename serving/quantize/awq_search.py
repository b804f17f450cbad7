"""Activation-aware scaling (AWQ): find per-input-channel scales that make 4 bits hurt less.

Channels that carry large activations matter most. AWQ multiplies those weight columns by
s > 1 before rounding (so they lose less precision) and divides the layer's input by s, which
costs nothing at run time because 1/s is folded into whatever produced the input: an RMSNorm
weight, or the output rows of the linear layer before. In floating point the model computes
exactly the same function; only the rounding changes.

For each group of linears that share one input (q/k/v after input_layernorm, gate/up after
post_attention_layernorm, down after up_proj, o after v_proj when their shapes match), the
search tries s = mean|x|^a for a in 0, 1/n, ..., (n-1)/n, normalised around 1, and keeps
the a whose fake-quantized layers reproduce the full-precision outputs on calibration
activations with the least squared error. a = 0 is plain round-to-nearest, so the result is
never worse than RTN on the calibration set; both errors are recorded.

Usage:
    stats = capture_inputs(model, layers, batches, max_rows=2048)
    results = [search_and_apply(group, stats[group.key], group_size=128) for group in groups]
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch import nn

from serving.quantize.awq_math import fake_quantize


@dataclass(frozen=True)
class ScaleGroup:
    """Linears that read one input, and the module whose output that input is."""

    key: str  # e.g. "model.layers.0.mlp.gate_proj+up_proj"
    previous: nn.Module  # an RMSNorm (its weight) or an nn.Linear (its output rows)
    linears: tuple[nn.Linear, ...]
    clipped: tuple[nn.Linear, ...]  # those whose weight ranges awq_clip may shrink


@dataclass
class InputStats:
    """Per-channel mean |x| over every calibration token, and a sample of whole rows."""

    abs_sum: torch.Tensor
    count: int = 0
    rows: list[torch.Tensor] = field(default_factory=list)

    @property
    def mean_abs(self) -> torch.Tensor:
        return self.abs_sum / max(1, self.count)

    def sample(self) -> torch.Tensor:
        return torch.cat(self.rows)


@dataclass(frozen=True)
class SearchResult:
    key: str
    ratio: float  # the chosen exponent a; 0 means plain round-to-nearest won
    rtn_error: float  # mean squared output error with s = 1
    awq_error: float  # with the chosen scales
    scales: torch.Tensor = field(repr=False, compare=False)  # s (ones when ratio is 0)

    def summary(self) -> dict[str, float | str]:
        return {"key": self.key, "ratio": self.ratio, "rtn_error": self.rtn_error,
                "awq_error": self.awq_error}  # fmt: skip


def _linear(layer: nn.Module, name: str) -> nn.Linear:
    module = layer.get_submodule(name)
    if not isinstance(module, nn.Linear):
        raise TypeError(f"{name} is a {type(module).__name__}, not a Linear")
    return module


def decoder_scale_groups(prefix: str, layer: nn.Module) -> list[ScaleGroup]:
    """The scale groups of a Qwen2/Qwen3 dense decoder layer (transformers module names)."""
    q, k, v, o = (_linear(layer, f"self_attn.{n}_proj") for n in "qkvo")
    gate, up, down = (_linear(layer, f"mlp.{n}_proj") for n in ("gate", "up", "down"))
    groups = [
        ScaleGroup(
            f"{prefix}.self_attn.q_proj+k_proj+v_proj",
            layer.get_submodule("input_layernorm"),
            (q, k, v),
            (v,),
        ),
        ScaleGroup(
            f"{prefix}.mlp.gate_proj+up_proj",
            layer.get_submodule("post_attention_layernorm"),
            (gate, up),
            (gate, up),
        ),
        ScaleGroup(f"{prefix}.mlp.down_proj", up, (down,), (down,)),
    ]
    # With grouped-query attention v_proj has fewer outputs than o_proj has inputs, so 1/s
    # cannot be folded into it; o_proj is then rounded plainly (as AutoAWQ does).
    if v.out_features == o.in_features:
        groups.append(ScaleGroup(f"{prefix}.self_attn.o_proj", v, (o,), (o,)))
    return groups


def capture_inputs(
    model: nn.Module,
    groups: list[ScaleGroup],
    batches: Iterable[torch.Tensor],
    *,
    max_rows: int,
) -> dict[str, InputStats]:
    """Run the calibration batches once, recording each group's input statistics."""
    stats: dict[str, InputStats] = {}
    budget: dict[str, int] = {}
    batch_list = list(batches)
    rows_per_batch = max(1, max_rows // max(1, len(batch_list)))

    def hook_for(key: str) -> object:
        def record(_module: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            x = args[0].detach().float().reshape(-1, args[0].shape[-1])
            entry = stats.setdefault(key, InputStats(torch.zeros(x.shape[1])))
            entry.abs_sum += x.abs().sum(dim=0)
            entry.count += x.shape[0]
            take = min(rows_per_batch, budget.get(key, max_rows), x.shape[0])
            if take > 0:
                # Evenly spaced rows: every position in the sequence is represented.
                index = torch.linspace(0, x.shape[0] - 1, take).round().long()
                entry.rows.append(x[index])
                budget[key] = budget.get(key, max_rows) - take

        return record

    handles = [group.linears[0].register_forward_pre_hook(hook_for(group.key)) for group in groups]
    try:
        with torch.no_grad():
            for batch in batch_list:
                model(input_ids=batch)
    finally:
        for handle in handles:
            handle.remove()
    return stats


def _output_error(x: torch.Tensor, weight: torch.Tensor, reference: torch.Tensor) -> float:
    return float(((x @ weight.t() - reference) ** 2).mean())


def search_and_apply(
    group: ScaleGroup, stats: InputStats, *, group_size: int, grid: int = 20
) -> SearchResult:
    """Find the best scales for `group`, then fold them into the model in place."""
    x = stats.sample()
    weight = torch.cat([linear.weight.detach().float() for linear in group.linears])
    reference = x @ weight.t()
    mean_abs = stats.mean_abs.clamp(min=1e-8)
    rtn_error = _output_error(x, fake_quantize(weight, group_size), reference)
    best_ratio, best_error, best_scales = 0.0, rtn_error, torch.ones_like(mean_abs)
    for step in range(1, grid):
        ratio = step / grid
        scales = mean_abs.pow(ratio).clamp(min=1e-4)
        scales = scales / (scales.max() * scales.min()).sqrt()
        error = _output_error(x, fake_quantize(weight * scales, group_size) / scales, reference)
        if error < best_error:
            best_ratio, best_error, best_scales = ratio, error, scales
    if best_ratio > 0:
        apply_scales(group, best_scales)
    return SearchResult(group.key, best_ratio, rtn_error, best_error, best_scales)


def apply_scales(group: ScaleGroup, scales: torch.Tensor) -> None:
    """W[:, c] *= s[c] in each linear; the producer's output channel c /= s[c]."""
    with torch.no_grad():
        previous = group.previous
        if isinstance(previous, nn.Linear):
            previous.weight.div_(scales.to(previous.weight.dtype)[:, None])
            if previous.bias is not None:
                previous.bias.div_(scales.to(previous.bias.dtype))
        else:
            norm_weight = previous.weight
            assert isinstance(norm_weight, torch.Tensor)
            norm_weight.div_(scales.to(norm_weight.dtype))
        for linear in group.linears:
            linear.weight.mul_(scales.to(linear.weight.dtype)[None, :])
