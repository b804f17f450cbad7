"""What the gateway does with each field vLLM 0.32 reads from a metered body (docs/gateway.md,
what a request reserves).

    check_fields("chat", data)     # or InvalidRequestError naming the field

vLLM ignores fields its request models do not declare, so each declared field is classified
here, per route:
- counted: the prompt estimate includes it (`prompt_estimate`, `responses_request`,
  `anthropic_request`, `pooling_request`);
- free: it changes sampling or the answer's shape, never the prompt nor the tokens beyond
  max_tokens x choices (a truncation only lowers the prompt);
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

Kind = Literal["chat", "completion", "responses", "messages", "embeddings", "score", "rerank"]
# The routes of pooling models: prompt tokens only, nothing generated (`pooling_request`).
POOLING: Final[frozenset[Kind]] = frozenset({"embeddings", "score", "rerank"})

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
_PADDING = "padding to the context window is charged the whole window per input; leave it unset"
_NO_USAGE = (
    "a binary answer carries its usage outside the JSON body, where the gateway does not read "
    "it; use 'float' or 'base64'"
)

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
# Pooling requests declare fewer of vLLM's engine fields than the generating ones.
_POOLING_REFUSED: Final[dict[str, Refusal]] = {
    "mm_processor_kwargs": (_PROCESSOR, (None, {})),
    "priority": (_ENGINE, (None, 0)),
    "padding": (_PADDING, (None, "do_not_pad")),
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
    "embeddings": {
        **_POOLING_REFUSED,
        "chat_template": (_TEMPLATE, (None,)),
        "media_io_kwargs": (_PROCESSOR, (None, {})),
        "encoding_format": (_NO_USAGE, (None, "float", "base64")),
    },
    "score": dict(_POOLING_REFUSED),
    "rerank": dict(_POOLING_REFUSED),
}
_SCORE_COUNTED = frozenset(
    {
        "queries", "documents", "items", "data_1", "data_2", "text_1", "text_2",
        "instruction", "chat_template_kwargs",
    }
)  # fmt: skip
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
    # `input` (text, token ids, a conversation, batches of them) or `messages`; the chat
    # options shape the rendered conversation (`pooling_request`).
    "embeddings": frozenset(
        {
            "input",
            "messages",
            "chat_template_kwargs",
            "add_generation_prompt",
            "continue_final_message",
            "add_special_tokens",
        }
    ),
    # Every pair is rendered with the instruction (`instruction` is folded into the score
    # template's kwargs by vLLM).
    "score": _SCORE_COUNTED,
    "rerank": frozenset({"query", "documents", "instruction", "chat_template_kwargs"}),
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
# Truncation only ever lowers the prompt; the rest shapes the answer (`dimensions`,
# `encoding_format`'s JSON values, `top_n`) or names the request.
_POOLING_FREE = frozenset(
    {
        "model", "user", "request_id", "cache_salt", "truncate_prompt_tokens",
        "truncation_side", "use_activation",
    }
)  # fmt: skip
_SCORING_FREE = _POOLING_FREE | {"max_tokens_per_query", "max_tokens_per_doc"}
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
    "embeddings": _POOLING_FREE | {"dimensions", "embed_dtype", "endianness"},
    "score": _SCORING_FREE,
    "rerank": _SCORING_FREE | {"top_n"},
}

# chat_template_kwargs a shipped Qwen template reads: switches, and what it renders like the
# top-level fields of the same name (counted there too). Any other key: 400.
TEMPLATE_SWITCHES: Final = frozenset({"enable_thinking", "add_vision_id"})
TEMPLATE_RENDERED: Final = frozenset({"tools", "documents"})
# What vLLM's Qwen3 reranker score templates read (instead of their default instruction);
# strings only, each counted once per pair. Any other key: 400.
SCORE_TEMPLATE_TEXTS: Final = frozenset({"instruction", "instruct"})


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
    if kwargs is not None and (kind == "score" or kind == "rerank"):
        check_score_template_kwargs(kwargs)
    elif kwargs is not None:
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


def check_score_template_kwargs(kwargs: object) -> None:
    if not isinstance(kwargs, dict):
        raise InvalidRequestError(
            "'chat_template_kwargs' must be an object.", param="chat_template_kwargs"
        )
    for key, value in kwargs.items():
        param = f"chat_template_kwargs.{key}"
        if key not in SCORE_TEMPLATE_TEXTS:
            allowed = ", ".join(sorted(SCORE_TEMPLATE_TEXTS))
            raise InvalidRequestError(
                f"'{param}' is not accepted by this gateway: the score template could render "
                f"it into every pair uncounted (accepted: {allowed}).",
                param=param,
            )
        if value is not None and not isinstance(value, str):
            raise InvalidRequestError(f"'{param}' must be a string.", param=param)


def classified(kind: Kind) -> frozenset[str]:
    """Every field of vLLM's request model for `kind` that this module decides about."""
    return COUNTED[kind] | FREE[kind] | frozenset(REFUSED[kind])
