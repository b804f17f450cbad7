"""The tiny model's chat template renders tools, tool calls, tool results and thinking the way
Qwen3's does, and what it renders is what vLLM's hermes tool parser and qwen3 reasoning
parser read back (the project ships no Qwen template copy; vLLM's parsers are the reference)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from serving.models import tiny_tokenizer as tt
from serving.models.chat_template import THINK_END, TOOL_CALL_END, TOOL_CALL_START

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    },
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
]
WEATHER_CALL = {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'}
TIME_CALL = {"name": "get_time", "arguments": {"zone": "CET"}}  # transformers' form: a dict
CALLS: list[dict[str, Any]] = [
    {"id": "c1", "type": "function", "function": WEATHER_CALL},
    {"id": "c2", "type": "function", "function": TIME_CALL},
]
CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather and time in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": CALLS},
    {"role": "tool", "tool_call_id": "c1", "content": '{"temp_c": 21}'},
    {"role": "tool", "tool_call_id": "c2", "content": "14:05"},
]


@pytest.fixture(scope="module")
def hf_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoTokenizer

    out = tmp_path_factory.mktemp("tokenizer")
    tt.save_tokenizer(
        tt.train_tokenizer(tt.read_corpus(), vocab_size=512), out, model_max_length=512
    )
    return AutoTokenizer.from_pretrained(Path(out))


def render(tokenizer: Any, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    text: str = tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
    return text


def test_tools_render_in_a_system_turn_like_qwen3(hf_tokenizer: Any) -> None:
    prompt = render(hf_tokenizer, CONVERSATION[:2], tools=TOOLS, add_generation_prompt=True)
    system, user, opened = prompt.split("<|im_start|>")[1:]
    assert system.startswith("system\nBe brief.\n\n# Tools\n\n")
    tools_block = system.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0]
    # One JSON object a line, as the tool was sent (transformers' tojson, Qwen's separators).
    assert [json.loads(line) for line in tools_block.split("\n")] == TOOLS
    assert tools_block.split("\n")[0] == json.dumps(TOOLS[0], ensure_ascii=False)
    assert system.endswith(
        f'{TOOL_CALL_START}\n{{"name": <function-name>, "arguments": <args-json-object>}}\n'
        f"{TOOL_CALL_END}<|im_end|>\n"
    )
    assert user == "user\nWeather and time in Paris?<|im_end|>\n"
    assert opened == "assistant\n"


def test_tool_calls_and_results_render_like_qwen3(hf_tokenizer: Any) -> None:
    prompt = render(hf_tokenizer, CONVERSATION, tools=TOOLS, add_generation_prompt=True)
    turns = prompt.split("<|im_start|>")[3:]
    assert turns == [
        "assistant\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call><|im_end|>\n',
        # Consecutive tool results share one user turn.
        'user\n<tool_response>\n{"temp_c": 21}\n</tool_response>\n'
        "<tool_response>\n14:05\n</tool_response><|im_end|>\n",
        "assistant\n",
    ]  # fmt: skip


def test_what_the_template_writes_for_calls_is_what_vllms_hermes_parser_reads(
    hf_tokenizer: Any,
) -> None:
    from vllm.tool_parsers.hermes_tool_parser import Hermes2ProToolParser

    closed = render(hf_tokenizer, CONVERSATION[:3], tools=TOOLS)
    assistant = closed.split("<|im_start|>assistant\n", 1)[1].removesuffix("<|im_end|>\n")
    parsed = Hermes2ProToolParser(hf_tokenizer).extract_tool_calls(assistant, None)  # type: ignore[arg-type]
    assert parsed.tools_called and parsed.content is None
    found = [
        (call.function.name, json.loads(call.function.arguments)) for call in parsed.tool_calls
    ]
    expected = [(call["function"]["name"], call["function"]["arguments"]) for call in CALLS]
    assert found == [(name, json.loads(a) if isinstance(a, str) else a) for name, a in expected]


def test_thinking_opens_only_when_asked(hf_tokenizer: Any) -> None:
    ask = CONVERSATION[1:2]
    plain = render(hf_tokenizer, ask, add_generation_prompt=True)
    assert plain == tt.render_chat(ask, add_generation_prompt=True)
    assert render(hf_tokenizer, ask, add_generation_prompt=True, enable_thinking=False) == plain
    thinking = render(hf_tokenizer, ask, add_generation_prompt=True, enable_thinking=True)
    assert thinking == plain + "<think>\n"


def test_vllms_qwen3_parser_splits_a_thought_from_the_answer(hf_tokenizer: Any) -> None:
    from vllm.reasoning import ReasoningParserManager

    parser = ReasoningParserManager.get_reasoning_parser("qwen3")(
        hf_tokenizer, chat_template_kwargs={"enable_thinking": True}
    )
    output = f"the user asks about weather{THINK_END}\n\nIt is mild."
    reasoning, content = parser.extract_reasoning(output, None)  # type: ignore[arg-type]
    assert reasoning == "the user asks about weather"
    assert content == "\n\nIt is mild."
    off = ReasoningParserManager.get_reasoning_parser("qwen3")(
        hf_tokenizer, chat_template_kwargs={"enable_thinking": False}
    )
    assert off.extract_reasoning("It is mild.", None) == (None, "It is mild.")  # type: ignore[arg-type]
