"""The plan side of the memory load test: what the planner predicts for a profile, and a
workload sized so that every sequence holds a known number of KV blocks.

See `loadtest.memory` for the reasoning and the ramp that measures it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from loadtest.errors import LoadTestError
from loadtest.prompts import read_prompts, write_prompts
from serving.planner.kv import SequenceFit, sequence_fit
from serving.planner.profile_plan import profile_plan
from serving.profiles import load_profile

# Tokens the prompt reaches into its last block: room for the tokenizer's +-2 when prompts
# are sized (loadtest.prompts) on both sides of a block boundary.
MARGIN = 8
TOLERANCE_SEQUENCES = 1
TOLERANCE_USAGE = 0.05  # relative


@dataclass(frozen=True)
class Sizing:
    """One sequence of the workload: prompt + output tokens holding `blocks` KV blocks.

    Outputs vary between `output_min` and `output_tokens` (all inside the last block), so
    the users' requests end at different times instead of in lock-step waves."""

    block_size: int
    blocks: int
    prompt_tokens: int
    output_tokens: int  # the longest output
    output_min: int

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.output_tokens

    def holds_its_blocks(self, prompt_tokens: int) -> bool:
        """A prompt of this length takes all `blocks` at admission and decode adds none
        (vLLM writes K/V for every token but the last one sampled)."""
        at_admission = math.ceil(prompt_tokens / self.block_size)
        at_end = math.ceil((prompt_tokens + self.output_tokens - 1) / self.block_size)
        return at_admission == at_end == self.blocks


def size_sequence(
    block_size: int, max_model_len: int, *, blocks: int | None = None, output: int | None = None
) -> Sizing:
    margin = max(1, min(MARGIN, block_size // 4))
    count = blocks or max_model_len // block_size
    if count < 1 or count * block_size > max_model_len:
        raise LoadTestError(
            f"--blocks-per-sequence {count}: need 1..{max_model_len // block_size} "
            f"(max_model_len {max_model_len}, blocks of {block_size} tokens)"
        )
    room = block_size - 2 * margin
    out = output or room
    if not 1 <= out <= room:
        raise LoadTestError(
            f"--output-tokens {out}: a sequence holds all its blocks from admission only if "
            f"its output stays in the prompt's last block: 1..{room} with blocks of "
            f"{block_size} tokens"
        )
    low = out if output else max(1, room // 2)
    return Sizing(block_size, count, (count - 1) * block_size + margin, out, low)


@dataclass(frozen=True)
class Prediction:
    """What the planner predicts for the workload on the profile's engine (one replica)."""

    profile: str
    num_blocks: int  # vLLM's num_gpu_blocks
    block_size: int
    kv_tokens: int  # vLLM's "KV cache size: N tokens"
    max_num_seqs: int
    sizing: Sizing
    fit: SequenceFit
    sequences: int  # running at once: min(fit.sequences, max_num_seqs)
    binding: str  # "KV cache" or "max_num_seqs"

    @property
    def waiting_from(self) -> int:
        """The concurrency at which a request has to wait."""
        return self.sequences + 1

    @property
    def plateau_usage(self) -> float:
        return self.usage_at(self.sequences)

    def usage_at(self, users: int) -> float:
        held = min(users, self.sequences) * self.fit.blocks_per_sequence
        return held / self.fit.usable_blocks if self.fit.usable_blocks else 0.0

    def running_at(self, users: int) -> int:
        return min(users, self.sequences)

    def as_dict(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "num_blocks": self.num_blocks,
            "usable_blocks": self.fit.usable_blocks,
            "block_size": self.block_size,
            "kv_tokens": self.kv_tokens,
            "max_num_seqs": self.max_num_seqs,
            "prompt_tokens": self.sizing.prompt_tokens,
            "output_tokens": [self.sizing.output_min, self.sizing.output_tokens],
            "blocks_per_sequence": self.fit.blocks_per_sequence,
            "sequences": self.sequences,
            "binding": self.binding,
            "waiting_from": self.waiting_from,
            "plateau_usage": self.plateau_usage,
        }


def predict(
    profile_name: str, *, blocks: int | None = None, output: int | None = None
) -> Prediction:
    profile = load_profile(profile_name)
    plan = profile_plan(profile)
    if not plan.fits:
        raise LoadTestError(f"profile {profile.name} does not fit: {plan.binding}")
    s = plan.settings
    assert s.max_model_len is not None and s.max_num_seqs is not None
    sizing = size_sequence(plan.layout.block_size, s.max_model_len, blocks=blocks, output=output)
    fit = sequence_fit(plan.layout, plan.capacity, sizing.tokens)
    if fit.blocks_per_sequence != sizing.blocks:
        raise LoadTestError(
            f"the planner puts a {sizing.tokens}-token sequence in {fit.blocks_per_sequence} "
            f"blocks, the sizing in {sizing.blocks} (a hybrid model's state blocks?)"
        )
    if fit.sequences < 1:
        raise LoadTestError(f"not one {sizing.tokens}-token sequence fits {profile.name}'s cache")
    sequences = min(fit.sequences, s.max_num_seqs)
    return Prediction(
        profile=profile.name,
        num_blocks=plan.capacity.num_blocks,
        block_size=plan.layout.block_size,
        kv_tokens=plan.capacity.tokens,
        max_num_seqs=s.max_num_seqs,
        sizing=sizing,
        fit=fit,
        sequences=sequences,
        binding="max_num_seqs" if sequences < fit.sequences else "KV cache",
    )


def default_levels(sequences: int) -> list[int]:
    """1..S+2 for a handful; for more, a quarter steps up to S-1, then S, S+1, S+2."""
    if sequences <= 8:
        return list(range(1, sequences + 3))
    quarters = [max(1, sequences * i // 4) for i in (1, 2, 3)]
    return sorted({*quarters, sequences - 1, sequences, sequences + 1, sequences + 2})


def write_workload(prediction: Prediction, path: Path, *, prompts: int = 64) -> Path:
    """The workload YAML (loadtest.workload) for the prediction's sequences."""
    sizing = prediction.sizing
    data = {
        "description": (
            f"memory-plan ramp for {prediction.profile}: {sizing.prompt_tokens}-token prompts, "
            f"{sizing.output_min}-{sizing.output_tokens} output tokens, {sizing.blocks} KV "
            "blocks a sequence"
        ),
        "seed": 7,
        "num_prompts": prompts,
        "scenarios": [
            {
                "name": "memory",
                "prompt_tokens": sizing.prompt_tokens,
                "output_tokens": [sizing.output_min, sizing.output_tokens],
                "ignore_eos": True,
            }
        ],
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def keep_exact_prompts(path: Path, sizing: Sizing) -> int:
    """Drop prompts that tokenized across a block boundary; return how many are left."""
    prompts = read_prompts(path)
    kept = [p for p in prompts if sizing.holds_its_blocks(p.prompt_tokens)]
    if not kept:
        raise LoadTestError(f"no generated prompt holds exactly {sizing.blocks} blocks")
    if len(kept) < len(prompts):
        write_prompts(kept, path)
    return len(kept)


# ---------------------------------------------------------------------------------------
# The ramp: steps moved on by conditions in the engine's metrics.
