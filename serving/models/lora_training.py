"""LoRA training in plain torch: PEFT's forward on a frozen causal LM, without PEFT.

Each targeted `nn.Linear` of the decoder is wrapped so that `y = W x + (alpha / r) B A x`,
where A (r x in) starts as PEFT's Kaiming-uniform draw and B (out x r) as zeros, so the
adapted model starts as the base model. Only A and B train. The factors come back under the
module names of the transformers model (`model.layers.0.self_attn.q_proj`), which is what
PEFT's files are keyed by after its `base_model.model.` prefix.

Usage (in a build's child process, torch seeded and deterministic):
    factors, losses = train_lora(model, examples, settings, emit)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

# Where each targetable projection lives in a Qwen2/Qwen3 decoder layer.
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class Example:
    """One training sequence: the prompt (no loss) and the answer the adapter must give."""

    prompt: list[int]
    answer: list[int]


@dataclass(frozen=True, kw_only=True)
class LoraSettings:
    rank: int
    alpha: int
    target_modules: tuple[str, ...]
    steps: int
    batch_size: int
    learning_rate: float
    pad_id: int


class LoraLinear(nn.Module):  # type: ignore[misc]  # torch is not read (pyproject.toml)
    """A frozen linear layer plus a trainable low-rank update, scaled as PEFT scales it."""

    def __init__(self, base: nn.Linear, rank: int, alpha: int, generator: torch.Generator):
        super().__init__()
        self.base = base
        fan_in = base.in_features
        # PEFT's kaiming_uniform_(a=sqrt(5)) bound is 1/sqrt(fan_in); drawn from our generator.
        bound = 1 / math.sqrt(fan_in)
        initial = (torch.rand(rank, fan_in, generator=generator) * 2 - 1) * bound
        self.lora_A = nn.Parameter(initial)
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank))
        self.scale = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        update: torch.Tensor = (x @ self.lora_A.T) @ self.lora_B.T
        result: torch.Tensor = self.base(x) + update * self.scale
        return result


def wrap(
    model: nn.Module, settings: LoraSettings, generator: torch.Generator
) -> dict[str, LoraLinear]:
    """Freeze `model` and wrap its targeted projections; the wrappers by module name."""
    model.requires_grad_(False)
    wrapped: dict[str, LoraLinear] = {}
    layers = model.get_submodule("model.layers")
    assert isinstance(layers, nn.ModuleList)
    for index, layer in enumerate(layers):
        for name in settings.target_modules:
            block = "self_attn" if name in ATTENTION else "mlp"
            parent = layer.get_submodule(block)
            base = getattr(parent, name)
            assert isinstance(base, nn.Linear), f"{block}.{name} is not a Linear"
            adapted = LoraLinear(base, settings.rank, settings.alpha, generator)
            setattr(parent, name, adapted)
            wrapped[f"model.layers.{index}.{block}.{name}"] = adapted
    return wrapped


def _batch(
    examples: Sequence[Example], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids, attention mask and labels (loss on the answer tokens only)."""
    width = max(len(e.prompt) + len(e.answer) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    labels = torch.full((len(examples), width), -100, dtype=torch.long)
    for row, example in enumerate(examples):
        sequence = example.prompt + example.answer
        ids[row, : len(sequence)] = torch.tensor(sequence)
        mask[row, : len(sequence)] = 1
        labels[row, len(example.prompt) : len(sequence)] = torch.tensor(example.answer)
    return ids, mask, labels


def train_lora(
    model: nn.Module,
    examples: Sequence[Example],
    settings: LoraSettings,
    emit: Callable[[str, bool], None],
    generator: torch.Generator,
) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], list[float]]:
    """Train the factors; return {module name: (A, B)} and the loss of every step."""
    wrapped = wrap(model, settings, generator)
    parameters = [p for layer in wrapped.values() for p in (layer.lora_A, layer.lora_B)]
    optimizer = torch.optim.AdamW(parameters, lr=settings.learning_rate, weight_decay=0.0)
    model.train()
    losses: list[float] = []
    for step in range(settings.steps):
        for group in optimizer.param_groups:
            # Linear decay to zero (transformers' default schedule): the last steps settle.
            group["lr"] = settings.learning_rate * (1 - step / settings.steps)
        picks = torch.randint(0, len(examples), (settings.batch_size,), generator=generator)
        ids, mask, labels = _batch([examples[i] for i in picks.tolist()], settings.pad_id)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.item()))
        last = step + 1 == settings.steps
        emit(
            f"LoRA step {step + 1}/{settings.steps} loss {losses[-1]:.3f}",
            last or (step + 1) % max(1, settings.steps // 5) == 0,
        )
    model.eval()
    factors = {
        name: (layer.lora_A.detach().clone(), layer.lora_B.detach().clone())
        for name, layer in wrapped.items()
    }
    return factors, losses
