"""The profile's tool-calling, reasoning and structured-output fields: bad values name the field
before vLLM starts (vLLM's own parser checks what the fields render to, tests/engine)."""

from __future__ import annotations

import pytest

from serving.errors import ServingError
from serving.profiles import load_all_profiles
from serving.profiles.loader import parse_profile
from serving.profiles.model import Profile, StructuredOutputs

BASE = {
    "device": "cpu",
    "model": "builtin:qwen3-tiny",
    "served_model_name": "m",
    "max_model_len": 64,
}


def parse(**override: object) -> Profile:
    return parse_profile({**BASE, **override}, source="x.yaml", default_name="x")


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ({"enable_auto_tool_choice": True}, "enable_auto_tool_choice needs tool_call_parser"),
        ({"tool_call_parser": ""}, "tool_call_parser"),
        ({"reasoning_parser": ""}, "reasoning_parser"),
        ({"tool_strict_level": "everything"}, "tool_strict_level"),
        ({"structured_outputs": {"backend": "regexes"}}, "structured_outputs.backend"),
        ({"structured_outputs": {"disable_any_whitespace": True}}, "needs backend xgrammar"),
        ({"structured_outputs": {"whitespace": False}}, "structured_outputs.whitespace"),
        ({"default_chat_template_kwargs": ["enable_thinking"]}, "default_chat_template_kwargs"),
    ],
)
def test_bad_values_name_the_field(override: dict[str, object], field: str) -> None:
    with pytest.raises(ServingError) as excinfo:
        parse(**override)
    assert field in str(excinfo.value)
    assert "\n" not in str(excinfo.value)


def test_defaults_leave_vllm_at_its_own() -> None:
    profile = parse_profile(BASE, source="x.yaml", default_name="x")
    assert profile.tool_call_parser is None and profile.reasoning_parser is None
    assert not profile.enable_auto_tool_choice
    assert profile.tool_strict_level == "auto"
    assert profile.structured_outputs == StructuredOutputs()
    assert profile.default_chat_template_kwargs == {}


def test_tool_and_reasoning_settings_parse() -> None:
    profile = parse(
        tool_call_parser="hermes",
        enable_auto_tool_choice=True,
        reasoning_parser="qwen3",
        structured_outputs={"backend": "guidance", "disable_any_whitespace": True},
        default_chat_template_kwargs={"enable_thinking": False, "nested": {"a": [1]}},
    )
    assert profile.structured_outputs.backend == "guidance"
    assert profile.default_chat_template_kwargs["nested"] == {"a": [1]}


def test_reasoning_profiles_of_the_tiny_model_think_only_when_asked() -> None:
    # vLLM's qwen3 parser takes output for reasoning unless enable_thinking is false; the tiny
    # model's template opens <think> only when it is true. Both must agree by default.
    for profile in load_all_profiles():
        if profile.builtin_model is not None and profile.reasoning_parser == "qwen3":
            assert profile.default_chat_template_kwargs.get("enable_thinking") is False
