"""What the gateway does with each field vLLM 0.32 reads from a metered body (docs/gateway.md,
what a request reserves).

    check_fields("chat", data)     # or InvalidRequestError naming the field

vLLM ignores fields its request models do not declare, so each declared field is classified
here, per route:
- counted: the prompt estimate includes it (`openai_request`, `responses_request`);
- free: it changes sampling or the answer's shape, never the prompt nor the tokens beyond
  max_tokens x choices;
- refused with a 400 naming it unless absent or at its harmless default: its cost cannot be
  bounded, it hands the engine's controls to a client, or it breaks the charging of aborted
  streams (each reason is written next to its fields).
tests/gateway/test_request_fields.py holds the table against the installed vLLM: a field vLLM
adds is unclassified until someone decides about it here.
"""

from __future__ import annotations

from typing import Any, Final, Literal

from serving.gateway.errors import InvalidRequestError
from serving.vllm_limits import DEFAULT_STREAM_INTERVAL

Kind = Literal["chat", "completion", "responses", "messages"]

_TEMPLATE = "a request's own chat template can render anything into the prompt"
_PROCESSOR = "it changes how many prompt tokens an image becomes, which the gateway prices itself"
_ENGINE = "it controls the engine for every key, so the gateway never lets a client set it"
_MERGED = "merged stream deltas would hide the tokens of a stream cut short from its charge"
_EMBEDS = "prompt embeddings are not accepted: send text or token ids"
_STORED = (
    "the conversation it continues is kept by the engine, where the gateway cannot count it; "
    "send the earlier turns in 'input'"
)
_PROMPT_TEMPLATE = "stored prompt templates are not served; send the prompt in 'input'"
_BACKGROUND = "a background response runs after its request has ended, where it cannot be charged"

# name -> (why it is refused, the values that are let through as harmless)
Refusal = tuple[str, tuple[object, ...]]
_COMMON_REFUSED: Final[dict[str, Refusal]] = {
    "mm_processor_kwargs": (_PROCESSOR, (None, {})),
    "media_io_kwargs": (_PROCESSOR, (None, {})),
    "mm_payload": (_PROCESSOR, (None, "tensors")),
    "return_mm_kwargs": (_PROCESSOR, (None,)),
    "kv_transfer_params": (_ENGINE, (None,)),
    "ec_transfer_params": (_ENGINE, (None,)),
    "priority": (_ENGINE, (None, 0)),
}
REFUSED: Final[dict[Kind, dict[str, Refusal]]] = {
    "chat": {
        **_COMMON_REFUSED,
        "chat_template": (_TEMPLATE, (None,)),
        "stream_interval": (_MERGED, (None, DEFAULT_STREAM_INTERVAL)),
    },
    "completion": {
        **_COMMON_REFUSED,
        "prompt_embeds": (_EMBEDS, (None,)),
        "stream_interval": (_MERGED, (None, DEFAULT_STREAM_INTERVAL)),
    },
    "responses": {
        **_COMMON_REFUSED,
        "previous_response_id": (_STORED, (None,)),
        "prompt": (_PROMPT_TEMPLATE, (None,)),
        "background": (_BACKGROUND, (None, False)),
    },
    # Anthropic Messages: vLLM turns the body into a chat request, and renders it the same way.
    "messages": dict(_COMMON_REFUSED),
}
COUNTED: Final[dict[Kind, frozenset[str]]] = {
    "chat": frozenset(
        {
            "messages",
            "tools",
            "documents",
            "chat_template_kwargs",
            "response_format",
            "tool_choice",
            "reasoning_effort",
            "add_generation_prompt",
            "continue_final_message",
            "add_special_tokens",
        }
    ),
    "completion": frozenset({"prompt", "suffix", "add_special_tokens"}),
    "responses": frozenset(
        {
            "input",
            "instructions",
            "tools",
            "tool_choice",
            "text",
            "reasoning",
            "chat_template_kwargs",
            "previous_input_messages",
        }
    ),
    # `output_config` becomes the chat request's response_format and reasoning_effort,
    # `thinking` its reasoning_effort or thinking budget: both counted like chat's.
    "messages": frozenset(
        {
            "messages",
            "system",
            "tools",
            "tool_choice",
            "thinking",
            "output_config",
            "chat_template_kwargs",
        }
    ),
}
_SAMPLING = frozenset(
    {
        "model", "stream", "stream_options", "max_tokens", "n", "temperature", "top_p",
        "top_k", "min_p", "seed", "stop", "stop_token_ids", "ignore_eos", "min_tokens",
        "presence_penalty", "frequency_penalty", "repetition_penalty", "length_penalty",
        "logit_bias", "allowed_token_ids", "bad_words", "logprobs", "prompt_logprobs",
        "logprob_token_ids", "skip_special_tokens", "spaces_between_special_tokens",
        "include_stop_str_in_output", "structured_outputs", "user",
        "request_id", "session_id", "cache_salt", "vllm_xargs", "watermarking",
        "repetition_detection", "thinking_token_budget", "truncate_prompt_tokens",
        "truncation_side", "use_beam_search", "echo", "return_token_ids",
        "return_token_offsets", "return_tokens_as_token_ids", "routed_experts_prompt_start",
    }
)  # fmt: skip
_RESPONSES_FREE = frozenset(
    {
        "model", "stream", "max_output_tokens", "max_tool_calls", "metadata", "include",
        "include_reasoning", "parallel_tool_calls", "service_tier", "store", "temperature",
        "top_p", "top_k", "min_p", "top_logprobs", "truncation", "user", "seed", "stop",
        "stop_token_ids", "ignore_eos", "skip_special_tokens", "include_stop_str_in_output",
        "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias",
        "prompt_cache_key", "request_id", "session_id", "cache_salt", "structured_outputs",
        "vllm_xargs", "watermarking", "enable_response_messages",
    }
)  # fmt: skip
# `metadata` is read by no renderer (vLLM drops it); `stop_sequences` are chat's `stop`.
_MESSAGES_FREE = frozenset(
    {
        "model", "stream", "max_tokens", "metadata", "stop_sequences", "temperature", "top_k",
        "top_p", "cache_salt", "watermarking", "vllm_xargs",
    }
)  # fmt: skip
FREE: Final[dict[Kind, frozenset[str]]] = {
    "chat": _SAMPLING
    | {
        "max_completion_tokens",
        "parallel_tool_calls",
        "top_logprobs",
        "include_reasoning",
        "return_prompt_text",
    },
    # A completion's response_format only shapes the output; chat counts it (COUNTED).
    "completion": _SAMPLING | {"best_of", "response_format"},
    "responses": _RESPONSES_FREE,
    "messages": _MESSAGES_FREE,
}

# chat_template_kwargs a shipped Qwen template reads: switches, and what it renders like the
# top-level fields of the same name (counted there too). Any other key: 400.
TEMPLATE_SWITCHES: Final = frozenset({"enable_thinking", "add_vision_id"})
TEMPLATE_RENDERED: Final = frozenset({"tools", "documents"})


def check_fields(kind: Kind, data: dict[str, Any]) -> None:
    """Raise InvalidRequestError naming the first field refused on this route."""
    refused = REFUSED[kind]
    for name, value in data.items():
        rule = refused.get(name)
        if rule is not None and not _is_harmless(value, rule[1]):
            raise InvalidRequestError(
                f"'{name}' is not accepted by this gateway: {rule[0]}.", param=name
            )
    kwargs = data.get("chat_template_kwargs")
    if kwargs is not None:
        check_template_kwargs(kwargs)


def _is_harmless(value: object, allowed: tuple[object, ...]) -> bool:
    # `==` would let `False` through where 0 is allowed, and 0 where False is.
    return any(type(value) is type(ok) and value == ok for ok in allowed)


def check_template_kwargs(kwargs: object) -> None:
    if not isinstance(kwargs, dict):
        raise InvalidRequestError(
            "'chat_template_kwargs' must be an object.", param="chat_template_kwargs"
        )
    for key, value in kwargs.items():
        param = f"chat_template_kwargs.{key}"
        if key in TEMPLATE_SWITCHES:
            if not isinstance(value, bool):
                raise InvalidRequestError(f"'{param}' must be a boolean.", param=param)
        elif key not in TEMPLATE_RENDERED:
            allowed = ", ".join(sorted(TEMPLATE_SWITCHES | TEMPLATE_RENDERED))
            raise InvalidRequestError(
                f"'{param}' is not accepted by this gateway: the chat template could render it "
                f"into the prompt uncounted (accepted: {allowed}).",
                param=param,
            )


def classified(kind: Kind) -> frozenset[str]:
    """Every field of vLLM's request model for `kind` that this module decides about."""
    return COUNTED[kind] | FREE[kind] | frozenset(REFUSED[kind])
