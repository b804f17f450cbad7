"""The text side of the embedded tiny model: the shipped corpus and a BPE tokenizer for it.

The pipeline (NFC, Qwen's pre-tokenizer regex, byte-level bytes, no BOS) is the one
`transformers`' Qwen2 tokenizer builds, so loading the files as `Qwen2TokenizerFast` (what
real Qwen checkpoints name) gives the same ids as the `tokenizers` object trained here.

Usage: `tok = train_tokenizer(read_corpus(), vocab_size=2048); save_tokenizer(tok, out_dir)`.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    normalizers,
    pre_tokenizers,
    trainers,
)
from tokenizers.models import BPE

from serving.models.cached_build import write_json
from serving.models.chat_template import ADDED_TOKENS, CHAT_TEMPLATE

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
# Their order fixes their ids: 0, 1, 2.
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)

# Qwen2's pre-tokenizer split (contractions, letter runs, single digits, punctuation, spaces).
PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# A word must occur twice to earn a merge: merges of one-off words only memorise the corpus.
MIN_FREQUENCY = 2


def special_token_ids() -> dict[str, int]:
    """The trainer gives the special tokens the first ids, in the order of SPECIAL_TOKENS."""
    return {token: index for index, token in enumerate(SPECIAL_TOKENS)}


def corpus_dir() -> Path:
    return Path(__file__).parent / "corpus"


def corpus_files() -> list[Path]:
    """The shipped text files, sorted so every consumer sees them in the same order."""
    return sorted(corpus_dir().glob("*.txt"))


def read_corpus(files: Iterable[Path] | None = None) -> list[str]:
    return [
        path.read_text(encoding="utf-8") for path in (corpus_files() if files is None else files)
    ]


def paragraphs(texts: Iterable[str]) -> list[str]:
    """Blank-line separated paragraphs, each joined onto one line."""
    found: list[str] = []
    for text in texts:
        for block in re.split(r"\n\s*\n", text):
            joined = " ".join(block.split())
            if joined:
                found.append(joined)
    return found


def render_chat(messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool) -> str:
    """What CHAT_TEMPLATE (chat_template.py) renders for plain-string messages, without tools
    or thinking; the training data uses it and a test keeps the two equal."""
    rendered = "".join(
        f"{IM_START}{message['role']}\n{message['content']}{IM_END}\n" for message in messages
    )
    return rendered + (f"{IM_START}assistant\n" if add_generation_prompt else "")


def training_documents(texts: Iterable[str], *, seed: int) -> list[str]:
    """Each paragraph twice: as plain text, and as a chat whose user turn is its first sentence.

    The chat copies teach the model the ChatML turns and to end its answer with <|im_end|>.
    """
    documents: list[str] = []
    for paragraph in paragraphs(texts):
        documents.append(paragraph + ENDOFTEXT)
        first, *rest = re.split(r"(?<=[.?!])\s+", paragraph, maxsplit=1)
        if not rest:
            continue
        messages = [{"role": "user", "content": first}, {"role": "assistant", "content": rest[0]}]
        documents.append(render_chat(messages, add_generation_prompt=False))
    random.Random(seed).shuffle(documents)
    return documents


def train_tokenizer(texts: Sequence[str], *, vocab_size: int) -> Tokenizer:
    """Train byte-level BPE; deterministic for the same texts (checked by the tests)."""
    tokenizer = Tokenizer(BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=MIN_FREQUENCY,
        special_tokens=list(SPECIAL_TOKENS),
        # All 256 byte symbols, so any UTF-8 text encodes without an unknown token.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    # After training, so they take the ids after the learned vocabulary and change no merge.
    # Not normalised (matched as written), not special (kept in decoded text for vLLM's
    # tool and reasoning parsers): as in Qwen's tokenizer.json.
    tokenizer.add_tokens(
        [AddedToken(token, normalized=False, special=False) for token in ADDED_TOKENS]
    )
    return tokenizer


def _added_token(token: str, *, special: bool) -> dict[str, Any]:
    return {
        "content": token,
        "lstrip": False,
        "normalized": False,
        "rstrip": False,
        "single_word": False,
        "special": special,
    }


def tokenizer_config(model_max_length: int, added: Mapping[str, int]) -> dict[str, Any]:
    """`added`: the ids of ADDED_TOKENS in the trained tokenizer."""
    special = {
        str(index): _added_token(token, special=True)
        for token, index in special_token_ids().items()
    }
    special.update(
        {str(index): _added_token(token, special=False) for token, index in added.items()}
    )
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": special,
        "additional_special_tokens": [IM_START, IM_END],
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": IM_END,
        "errors": "replace",
        "model_max_length": model_max_length,
        "pad_token": ENDOFTEXT,
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2TokenizerFast",
        "unk_token": None,
    }


def save_tokenizer(tokenizer: Tokenizer, out_dir: Path, *, model_max_length: int) -> None:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json."""
    (out_dir / "tokenizer.json").write_text(tokenizer.to_str(pretty=True) + "\n", encoding="utf-8")
    added = {
        token: index
        for token in ADDED_TOKENS
        if (index := tokenizer.token_to_id(token)) is not None
    }
    write_json(out_dir / "tokenizer_config.json", tokenizer_config(model_max_length, added))
    write_json(
        out_dir / "special_tokens_map.json",
        {
            "additional_special_tokens": [IM_START, IM_END],
            "eos_token": IM_END,
            "pad_token": ENDOFTEXT,
        },
    )
