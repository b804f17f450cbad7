"""The tiny model's chat template: ChatML as Qwen2.5/Qwen3 render it, tools and thinking included.

vLLM's `hermes` tool parser and `qwen3` reasoning parser read what Qwen models write, so the
tiny model's template renders what Qwen's do (the structure of Qwen3's `chat_template`):

- `tools` go into a system turn: a preamble, one JSON object a line inside `<tools></tools>`,
  and the `<tool_call>` format (before the caller's own system message's text, if any);
- an assistant turn's `tool_calls` are `<tool_call>\\n{"name": ..., "arguments": ...}\\n
  </tool_call>` blocks after its content;
- `tool` messages are `<tool_response>` blocks, consecutive ones in one user turn;
- the generation prompt opens `<think>\\n` when `enable_thinking` is true.

One difference from Qwen3, on purpose: thinking is off unless asked for (Qwen3 thinks unless
told not to, and then renders an empty think block). The tiny model never learned to think,
so a plain chat renders the plain ChatML it was trained on; profiles serving it set
`enable_thinking: false` as vLLM's default so the reasoning parser agrees.

Usage: the tokenizer files name `CHAT_TEMPLATE`; `ADDED_TOKENS` become single tokens, as they
are in Qwen's vocabularies (added, not special: they stay in decoded text for the parsers).
"""

from __future__ import annotations

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
TOOL_RESPONSE_START = "<tool_response>"
TOOL_RESPONSE_END = "</tool_response>"
THINK_START = "<think>"
THINK_END = "</think>"
# In Qwen's id order (Qwen3: 151657, 151658, 151665, 151666, 151667, 151668).
ADDED_TOKENS = (
    TOOL_CALL_START,
    TOOL_CALL_END,
    TOOL_RESPONSE_START,
    TOOL_RESPONSE_END,
    THINK_START,
    THINK_END,
)

TOOLS_PREAMBLE = (
    "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>"
)
TOOLS_POSTAMBLE = (
    "\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n"
    '{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call>'
)

# Jinja, as transformers and vLLM render it; `content` may be None on a tool-calling turn.
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    '{{- "' + TOOLS_PREAMBLE + '" }}'
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    '{{- "' + TOOLS_POSTAMBLE + '<|im_end|>\\n" }}'
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- set content = message.content or '' %}"
    "{%- if message.role == 'system' and loop.first and tools %}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' + content }}"
    "{%- for tool_call in message.tool_calls or [] %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    "{%- if not loop.first or content %}{{- '\\n' }}{%- endif %}"
    '{{- \'<tool_call>\\n{"name": "\' + tool_call.name + \'", "arguments": \' }}'
    "{%- if tool_call.arguments is string %}{{- tool_call.arguments }}"
    "{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}"
    "{{- '<|im_start|>user' }}"
    "{%- endif %}"
    "{{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking %}{{- '<think>\\n' }}{%- endif %}"
    "{%- endif %}"
)
