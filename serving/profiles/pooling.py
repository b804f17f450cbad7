"""A profile's pooling fields: vLLM's pooling runner, serving embeddings or relevance scores.

    runner: pooling              # vLLM's runner: no sampler, no LM head; the engine answers
                                 # /v1/embeddings or /score, /rerank (vLLM picks by the model)
    convert: embed               # a *ForCausalLM checkpoint served as an embedding model
    pooler_config:               # hidden states -> one vector or score
      seq_pooling_type: LAST     # Qwen3-Embedding: the last token's hidden state
      use_activation: true       # embeddings: L2-normalised; scores: a sigmoid
    hf_overrides: {...}          # config.json fields vLLM reads instead of the checkpoint's
    chat_template: builtin:qwen3-reranker   # the prompt a score request is rendered with: a
                                 # template shipped in serving/profiles/templates, or a path

Each is vLLM's own flag (`serving.vllm_flags` renders them). The generation-only fields of a
profile (tool and reasoning parsers, structured outputs) are refused beside `runner: pooling`:
a pooling engine writes no text for them to parse.

Usage: `template_path("builtin:qwen3-reranker")` -> the shipped file, for vLLM.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from serving.paths import BUILTIN_PREFIX

Runner = Literal["generate", "pooling"]
Convert = Literal["embed", "classify"]
TEMPLATES_DIR = Path(__file__).parent / "templates"
TEMPLATE_SUFFIX = ".jinja"


class PoolerConfig(BaseModel):
    """vLLM's PoolerConfig fields a profile may set (vllm/config/pooler.py); unset ones take
    what the checkpoint says (sentence-transformers' modules.json), else vLLM's default."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seq_pooling_type: Literal["CLS", "LAST", "MEAN"] | None = None
    use_activation: bool | None = None


def builtin_template_names() -> list[str]:
    return sorted(path.stem for path in TEMPLATES_DIR.glob(f"*{TEMPLATE_SUFFIX}"))


def check_chat_template(value: str) -> None:
    """A `builtin:NAME` template must be one this package ships (a path is checked when the
    engine starts: the profile may be rendered on another machine)."""
    if not value.startswith(BUILTIN_PREFIX):
        return
    name = value.removeprefix(BUILTIN_PREFIX)
    if name not in builtin_template_names():
        known = ", ".join(BUILTIN_PREFIX + known for known in builtin_template_names())
        raise ValueError(f"unknown builtin template {name!r} (known: {known})")


def template_path(value: str) -> str:
    """What vLLM's chat template flag gets: a shipped template's file, a local file made
    absolute, or the value as written."""
    if value.startswith(BUILTIN_PREFIX):
        return str(TEMPLATES_DIR / f"{value.removeprefix(BUILTIN_PREFIX)}{TEMPLATE_SUFFIX}")
    local = Path(value).expanduser()
    return str(local.resolve()) if local.is_file() else value


def template_argument(value: str, *, inline: bool = False) -> str:
    """`template_path`, or with `inline` the template's text, for an engine on another
    machine (a pod) that has neither a shipped template's file nor a local one: vLLM takes a
    value that is no file as the template itself (after undoing backslash escapes, which no
    shipped template has; a path that is not a file here goes as written)."""
    path = Path(template_path(value))
    return path.read_text(encoding="utf-8") if inline and path.is_file() else str(path)


# Profile fields that only a generating engine reads, with the value that leaves them unset.
GENERATION_ONLY: dict[str, object] = {
    "tool_call_parser": None,
    "enable_auto_tool_choice": False,
    "reasoning_parser": None,
}
