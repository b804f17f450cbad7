"""A profile's pooling fields: each bad value is refused naming its field in one line, the
generation-only fields are refused beside `runner: pooling`, and `builtin:` templates are the
ones this package ships."""

from __future__ import annotations

from pathlib import Path

import pytest

from serving.errors import ServingError
from serving.profiles import load_all_profiles
from serving.profiles.loader import parse_profile
from serving.profiles.model import Profile
from serving.profiles.pooling import TEMPLATES_DIR, builtin_template_names, template_path

BASE = {
    "device": "cpu",
    "model": "builtin:qwen3-tiny-embedding",
    "served_model_name": "m",
    "max_model_len": 64,
    "runner": "pooling",
}


def parse(**override: object) -> Profile:
    return parse_profile({**BASE, **override}, source="x.yaml", default_name="x")


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ({"runner": "draft"}, "field 'runner'"),
        ({"convert": "reward"}, "field 'convert'"),
        ({"runner": "generate", "convert": "embed"}, "convert: only for runner pooling"),
        ({"runner": "generate", "pooler_config": {}}, "pooler_config: only for runner pooling"),
        ({"pooler_config": {"seq_pooling_type": "FIRST"}}, "pooler_config.seq_pooling_type"),
        ({"pooler_config": {"normalize": True}}, "pooler_config.normalize"),
        ({"hf_overrides": ["architectures"]}, "field 'hf_overrides'"),
        ({"chat_template": ""}, "field 'chat_template'"),
        ({"chat_template": "builtin:qwen9-reranker"}, "unknown builtin template 'qwen9-reranker'"),
        ({"tool_call_parser": "hermes"}, "tool_call_parser: runner pooling generates no text"),
        ({"reasoning_parser": "qwen3"}, "reasoning_parser: runner pooling"),
        ({"structured_outputs": {"backend": "xgrammar"}}, "structured_outputs: runner pooling"),
    ],
)
def test_bad_values_name_the_field(override: dict[str, object], field: str) -> None:
    with pytest.raises(ServingError) as excinfo:
        parse(**override)
    assert field in str(excinfo.value)
    assert "\n" not in str(excinfo.value)


def test_a_pooling_profile_parses_every_field() -> None:
    profile = parse(
        convert="classify",
        pooler_config={"seq_pooling_type": "MEAN", "use_activation": False},
        hf_overrides={"architectures": ["Qwen3ForSequenceClassification"], "nested": {"a": 1}},
        chat_template="builtin:qwen3-reranker",
    )
    assert profile.pooler_config is not None
    assert profile.pooler_config.seq_pooling_type == "MEAN"
    assert profile.hf_overrides["nested"] == {"a": 1}


def test_templates_resolve_to_files(tmp_path: Path) -> None:
    assert builtin_template_names() == ["qwen3-reranker"]
    assert template_path("builtin:qwen3-reranker") == str(TEMPLATES_DIR / "qwen3-reranker.jinja")
    local = tmp_path / "mine.jinja"
    local.write_text("{{ messages }}")
    assert template_path(str(local)) == str(local.resolve())
    assert template_path("templates/elsewhere.jinja") == "templates/elsewhere.jinja"


def render(**kwargs: object) -> str:
    """The template rendered as vLLM renders a score prompt: transformers' chat template
    renderer (which drops one trailing newline), vLLM's query and document roles."""
    from transformers.utils.chat_template_utils import render_jinja_template

    text = (TEMPLATES_DIR / "qwen3-reranker.jinja").read_text()
    messages = [{"role": "query", "content": "Q?"}, {"role": "document", "content": "D."}]
    rendered, _ = render_jinja_template([messages], chat_template=text, **kwargs)
    return str(rendered[0])


def test_the_shipped_reranker_template_is_qwen3_rerankers_prompt() -> None:
    """The prompt of Qwen3-Reranker's model card, to the last newline, with the query and
    document where it puts them."""
    rendered = render()
    prefix = (
        "<|im_start|>system\nJudge whether the Document meets the requirements based on the "
        'Query and the Instruct provided. Note that the answer can only be "yes" or "no".'
        "<|im_end|>\n<|im_start|>user\n"
    )
    suffix = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    body = (
        "<Instruct>: Given a web search query, retrieve relevant passages that answer the query"
        "\n<Query>: Q?\n<Document>: D."
    )
    assert rendered == prefix + body + suffix
    assert "<Instruct>: Find it\n" in render(instruction="Find it")


def test_shipped_pooling_profiles_quote_their_classifier_tokens() -> None:
    """YAML reads a bare `no` as false: vLLM would look up the token "False"."""
    rerankers = [p for p in load_all_profiles() if "classifier_from_token" in p.hf_overrides]
    assert len(rerankers) >= 2
    for profile in rerankers:
        assert profile.hf_overrides["classifier_from_token"] == ["no", "yes"], profile.name
        assert profile.chat_template == "builtin:qwen3-reranker", profile.name
