"""Activation-aware scales: the float model is unchanged, and rounding loses less than RTN."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from serving.quantize.awq_search import (
    ScaleGroup,
    capture_inputs,
    decoder_scale_groups,
    search_and_apply,
)


def load(model_dir: Path) -> nn.Module:
    from transformers import AutoModelForCausalLM

    model: nn.Module = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    return model.train(False)


def groups_of(model: nn.Module) -> list[ScaleGroup]:
    layers = list(model.get_submodule("model.layers").children())
    return [g for i, layer in enumerate(layers) for g in decoder_scale_groups(f"L{i}", layer)]


def batches() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    return [torch.randint(10, 500, (1, 64), generator=generator) for _ in range(4)]


def test_groups_cover_qkv_gate_up_and_down_and_skip_o_under_gqa(small_qwen3: Path) -> None:
    keys = [g.key for g in groups_of(load(small_qwen3))]
    assert keys[:3] == [
        "L0.self_attn.q_proj+k_proj+v_proj",
        "L0.mlp.gate_proj+up_proj",
        "L0.mlp.down_proj",
    ]
    # 2 KV heads x 32 = 64 v outputs vs 128 o inputs: o_proj cannot take v's scales.
    assert not any("o_proj" in key for key in keys) and len(keys) == 6


def test_capture_records_means_over_all_tokens_and_a_bounded_sample(small_qwen3: Path) -> None:
    model = load(small_qwen3)
    groups = groups_of(model)
    stats = capture_inputs(model, groups, batches(), max_rows=100)
    down = stats["L0.mlp.down_proj"]
    assert down.count == 4 * 64 and down.sample().shape == (100, 256)
    assert stats["L1.self_attn.q_proj+k_proj+v_proj"].mean_abs.shape == (128,)


def test_scaling_keeps_the_float_model_and_beats_round_to_nearest(small_qwen3: Path) -> None:
    model = load(small_qwen3)
    groups = groups_of(model)
    # Outlier channels, as trained LLMs have: AWQ exists for these.
    with torch.no_grad():
        norm = model.get_parameter("model.layers.0.post_attention_layernorm.weight")
        norm[:4] *= 40
    probe = batches()[0]
    with torch.no_grad():
        before = model(input_ids=probe).logits
    stats = capture_inputs(model, groups, batches(), max_rows=256)
    results = [search_and_apply(g, stats[g.key], group_size=128) for g in groups]
    with torch.no_grad():
        after = model(input_ids=probe).logits
    torch.testing.assert_close(after, before, rtol=1e-4, atol=1e-4)
    assert all(r.awq_error <= r.rtn_error for r in results)
    outlier = next(r for r in results if r.key == "L0.mlp.gate_proj+up_proj")
    assert outlier.ratio > 0 and outlier.awq_error < 0.8 * outlier.rtn_error


@pytest.mark.parametrize("grid", [1, 5])
def test_grid_of_one_is_plain_rounding(small_qwen3: Path, grid: int) -> None:
    model = load(small_qwen3)
    groups = groups_of(model)[:1]
    stats = capture_inputs(model, groups, batches(), max_rows=64)
    result = search_and_apply(groups[0], stats[groups[0].key], group_size=128, grid=grid)
    if grid == 1:
        assert result.ratio == 0 and result.awq_error == result.rtn_error
    else:
        assert result.ratio in (0, 0.2, 0.4, 0.6, 0.8)
