"""Deterministic prompts from the shipped corpus, sized in the model's own tokens.

The corpus (`serving/models/corpus/*.txt`) is tokenized once; a prompt of N tokens is a
seeded window of that token stream, decoded and re-encoded until it is N tokens long (BPE
merges across the window's edges can shift the count by one or two). `prompt_tokens` is what
the engine will count: the user message rendered with the model's chat template.

The same workload, seed and tokenizer always give the same prompts (also across processes),
written once per run to prompts.jsonl in the form vLLM's benchmark `custom` dataset reads.

Usage: `prompts = generate_prompts(workload, tokenizer, max_model_len=2048)`.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol, cast

from loadtest.errors import LoadTestError
from loadtest.workload import Scenario, Workload
from serving.models.tiny_tokenizer import paragraphs, read_corpus

# Re-encoding passes before accepting a length that is off by a token or two.
SIZING_PASSES = 4


class Tokenizer(Protocol):
    """The part of a Hugging Face tokenizer used here."""

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, token_ids: Sequence[int]) -> str: ...

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...


@dataclass(frozen=True)
class Prompt:
    scenario: str
    prompt: str
    prompt_tokens: int  # with the chat template, as the engine counts them
    output_tokens: int
    ignore_eos: bool
    temperature: float


class CorpusText:
    """Token-exact text windows of the shipped corpus."""

    def __init__(self, tokenizer: Tokenizer, texts: Sequence[str] | None = None) -> None:
        self._tok = tokenizer
        # Paragraph by paragraph: one encode of the whole corpus would trip the tokenizer's
        # "longer than model_max_length" warning.
        separator = tokenizer.encode("\n\n", add_special_tokens=False)
        self._ids: list[int] = []
        for paragraph in paragraphs(read_corpus() if texts is None else texts):
            self._ids += tokenizer.encode(paragraph, add_special_tokens=False) + separator
        if not self._ids:
            raise LoadTestError("the corpus is empty: no text to build prompts from")

    def text(self, n_tokens: int, rng: random.Random) -> str:
        """A text of (almost always exactly) `n_tokens` tokens from a random corpus offset."""
        start = rng.randrange(len(self._ids))
        ids = [self._ids[(start + i) % len(self._ids)] for i in range(n_tokens)]
        text = self._tok.decode(ids)
        for _ in range(SIZING_PASSES):
            again = self._tok.encode(text, add_special_tokens=False)
            if len(again) == n_tokens:
                break
            if len(again) > n_tokens:
                again = again[:n_tokens]
            else:
                extra = start + n_tokens
                again += [
                    self._ids[(extra + i) % len(self._ids)] for i in range(n_tokens - len(again))
                ]
            text = self._tok.decode(again)
        return text

    def count(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False))

    def chat_tokens(self, content: str) -> int:
        rendered = self._tok.apply_chat_template(
            [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
        )
        return self.count(str(rendered))


def _template_overhead(corpus: CorpusText) -> int:
    probe = "hello"
    return corpus.chat_tokens(probe) - corpus.count(probe)


def _scenario_prompts(
    scenario: Scenario, count: int, corpus: CorpusText, rng: random.Random, max_model_len: int
) -> list[Prompt]:
    overhead = _template_overhead(corpus)
    p_low, p_high = scenario.prompt_range(max_model_len)
    o_low, o_high = scenario.output_range()
    prefixes = [
        corpus.text(scenario.shared_prefix_tokens, rng) + "\n\n"
        for _ in range(scenario.prefixes if scenario.shared_prefix_tokens else 0)
    ]
    made: list[Prompt] = []
    for index in range(count):
        total = rng.randint(p_low, p_high)
        prefix = prefixes[index % len(prefixes)] if prefixes else ""
        own = max(1, total - overhead - (corpus.count(prefix) if prefix else 0))
        content = prefix + corpus.text(own, rng)
        made.append(
            Prompt(
                scenario=scenario.name,
                prompt=content,
                prompt_tokens=corpus.chat_tokens(content),
                output_tokens=rng.randint(o_low, o_high),
                ignore_eos=scenario.ignore_eos,
                temperature=scenario.temperature,
            )
        )
    return made


def generate_prompts(
    workload: Workload,
    tokenizer: Tokenizer,
    *,
    max_model_len: int,
    texts: Sequence[str] | None = None,
) -> list[Prompt]:
    """`workload.num_prompts` prompts, split over scenarios by weight, interleaved by seed."""
    corpus = CorpusText(tokenizer, texts)
    rng = random.Random(workload.seed)
    total_weight = sum(s.weight for s in workload.scenarios)
    counts = [
        max(1, round(workload.num_prompts * s.weight / total_weight)) for s in workload.scenarios
    ]
    made: list[Prompt] = []
    for scenario, count in zip(workload.scenarios, counts, strict=True):
        made.extend(_scenario_prompts(scenario, count, corpus, rng, max_model_len))
    rng.shuffle(made)
    return made


def write_prompts(prompts: Sequence[Prompt], path: Path) -> None:
    with path.open("w", encoding="utf-8") as sink:
        for prompt in prompts:
            sink.write(json.dumps(asdict(prompt), ensure_ascii=False) + "\n")


def read_prompts(path: Path) -> list[Prompt]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
        return [Prompt(**json.loads(line)) for line in lines if line.strip()]
    except (OSError, ValueError, TypeError) as exc:
        raise LoadTestError(f"{path}: not a prompts file: {exc}") from exc


def load_tokenizer(source: str) -> Tokenizer:
    """A Hugging Face tokenizer from a model directory or hub name."""
    from transformers import AutoTokenizer

    return cast(Tokenizer, AutoTokenizer.from_pretrained(source))
