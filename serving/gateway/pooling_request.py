"""Upper bounds of the prompt tokens of the pooling routes, embeddings, score and rerank
(docs/retrieval.md, what a request reserves). A pooling model generates nothing: the bound
is the whole reservation.

    estimate = pooling_prompt_estimate("rerank", data, max_inputs=2048)   # or None: the default

Rules:
- text costs the UTF-8 bytes of its NFC form (`prompt_estimate.text_bytes`): Qwen's
  tokenizers normalise to NFC, which can triple a string's bytes, then run a byte-level BPE,
  which never makes more tokens than bytes; each text, token array
  or conversation adds `INPUT_SPECIAL_TOKENS` (those a tokenizer's post-processor adds:
  Qwen3-Embedding's appends `<|endoftext|>`);
- token ids cost their count: vLLM tokenizes nothing and adds nothing to them;
- a conversation (the chat form of `/v1/embeddings`) costs the chat estimate of it
  (`prompt_estimate`), its images refused: their price is the chat model's, not this one's;
- a score or rerank pair costs both its texts, the instruction and `PAIR_TOKENS`, the fixed
  text of the Qwen3 reranker's score template and the tokens any scoring form adds to a pair
  (a cross-encoder's separators, a bi-encoder's two inputs and vLLM's pad between them);
  vLLM's usage counts a query once per pair, and so does the bound;
- a batch (texts, conversations, pairs) holds at most `max_inputs`, and a body in more than
  one of a route's forms is refused: each 400 names the field, before anything is reserved.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from serving.gateway.errors import InvalidRequestError
from serving.gateway.images import ImagePolicy
from serving.gateway.prompt_estimate import chat_prompt_estimate, text_bytes
from serving.gateway.request_fields import SCORE_TEMPLATE_TEXTS, Kind

# Special tokens a tokenizer may add to one input (a BOS and an EOS).
INPUT_SPECIAL_TOKENS = 2
# The Qwen3 reranker's score template (vLLM's example, the profiles' builtin:qwen3-reranker)
# renders about 350 bytes of fixed text around a pair with its default instruction, so a
# byte-level BPE makes at most that many tokens of it; the rest covers two inputs' special
# tokens and a pad (tests/gateway/test_pooling_request.py measures the template).
PAIR_TOKENS = 384
# A score request's pairs come in one of these forms (vLLM's ScoreRequest variants).
_SCORE_FORMS = (("queries", "documents"), ("queries", "items"), ("data_1", "data_2"),
                ("text_1", "text_2"))  # fmt: skip
_SCORE_FIELDS = tuple(dict.fromkeys(name for form in _SCORE_FORMS for name in form))


def pooling_prompt_estimate(
    kind: Kind, data: dict[str, Any], *, max_inputs: int | None = None
) -> int:
    """The upper bound of the prompt tokens vLLM counts for `data` on the `kind` route; a
    batch holds at most `max_inputs` (None: the settings' default)."""
    if max_inputs is None:
        max_inputs = default_max_inputs()
    if kind == "embeddings":
        return _embeddings(data, max_inputs)
    if kind == "rerank":
        query = data.get("query")
        if not isinstance(query, str):
            raise _invalid("query", "'query' must be a string.")
        return _pairs(data, ("query", "documents"), [query], max_inputs)
    present = [name for name in _SCORE_FIELDS if data.get(name) is not None]
    form = next((form for form in _SCORE_FORMS if set(form) == set(present)), None)
    if form is None:
        forms = ", ".join(" and ".join(form) for form in _SCORE_FORMS)
        param = present[-1] if present else "queries"
        raise _invalid(param, f"Send exactly one pair of fields: {forms}.")
    return _pairs(data, form, _texts(data[form[0]], form[0]), max_inputs)


@functools.cache
def default_max_inputs() -> int:
    """`GatewaySettings.max_pooling_inputs`' default (it is written once, there)."""
    from serving.gateway.settings import GatewaySettings

    return int(GatewaySettings.model_fields["max_pooling_inputs"].default)


def text_tokens(text: str) -> int:
    """An upper bound of the tokens a Qwen tokenizer makes of `text` (no special tokens)."""
    return text_bytes(text)


# -- embeddings ------------------------------------------------------------------------------


def _embeddings(data: dict[str, Any], max_inputs: int) -> int:
    given = [name for name in ("input", "messages") if data.get(name) is not None]
    if len(given) != 1:
        raise _invalid(given[-1] if given else "input", "Send either 'input' or 'messages'.")
    name = given[0]
    value = data[name]
    if isinstance(value, str):
        return text_tokens(value) + INPUT_SPECIAL_TOKENS
    if not isinstance(value, list) or not value:
        raise _invalid(name, f"'{name}' must be a string or a non-empty array.")
    first = value[0]
    if name == "input" and not isinstance(first, (dict, list)):
        if _is_token(first):
            return _token_count(value, name)
        _check_count(len(value), max_inputs, name)
        return sum(_text(item, f"{name}[{index}]") for index, item in enumerate(value))
    if isinstance(first, dict):  # one conversation
        return _conversation(data, value, name)
    _check_count(len(value), max_inputs, name)
    total = 0
    for index, item in enumerate(value):
        where = f"{name}[{index}]"
        if not isinstance(item, list) or not item:
            raise _invalid(where, f"'{where}' must be a non-empty array.")
        if name == "input" and _is_token(item[0]):
            total += _token_count(item, where)
        else:
            total += _conversation(data, item, where)
    return total


def _text(value: object, where: str) -> int:
    if not isinstance(value, str):
        raise _invalid(where, f"'{where}' must be a string.")
    return text_tokens(value) + INPUT_SPECIAL_TOKENS


def _is_token(value: object) -> bool:
    return type(value) is int


def _token_count(ids: list[Any], where: str) -> int:
    for index, token in enumerate(ids):
        if type(token) is not int or token < 0:
            raise _invalid(f"{where}[{index}]", f"'{where}' must hold token ids (integers >= 0).")
    return len(ids)


def _conversation(data: dict[str, Any], messages: list[Any], where: str) -> int:
    """The chat estimate of one conversation, rendered with the request's chat options; a
    400 names the field as the client wrote it."""
    try:
        estimate = chat_prompt_estimate({**data, "messages": messages}, _text_only())
    except InvalidRequestError as exc:
        param = exc.param
        if param is not None and param.startswith("messages"):
            param = where + param.removeprefix("messages")
        raise _invalid(param or where, exc.message) from None
    return estimate + INPUT_SPECIAL_TOKENS


@functools.cache
def _text_only() -> ImagePolicy:
    return dataclasses.replace(ImagePolicy.defaults(), max_images=0)


# -- score and rerank ------------------------------------------------------------------------


def _pairs(data: dict[str, Any], form: tuple[str, str], first: list[str], max_inputs: int) -> int:
    """Every pair's bound: the query side (one text for all, or one per document), the
    documents, the instruction each pair renders, and `PAIR_TOKENS`."""
    second = _texts(data.get(form[1]), form[1])
    if len(first) > 1 and len(first) != len(second):
        raise _invalid(
            form[1],
            f"'{form[0]}' and '{form[1]}' must pair up 1:1, 1:N or N:N, "
            f"got {len(first)}:{len(second)}.",
        )
    _check_count(len(second), max_inputs, form[1])
    per_pair = PAIR_TOKENS + _instruction_tokens(data)
    firsts = [text_tokens(text) for text in first]
    if len(firsts) == 1:
        firsts *= len(second)
    pairs = zip(firsts, second, strict=True)
    return sum(query + text_tokens(text) + per_pair for query, text in pairs)


def _texts(value: object, name: str) -> list[str]:
    """A score input: one text or a non-empty array of them. Content parts (images) are
    refused, vLLM reading them only for a multimodal model whose prices are not known here."""
    items = value if isinstance(value, list) else [value]
    if not items:
        raise _invalid(name, f"'{name}' must not be empty.")
    texts: list[str] = []
    for index, item in enumerate(items):
        if not isinstance(item, str):
            where = f"{name}[{index}]" if isinstance(value, list) else name
            raise _invalid(where, f"'{where}' must be a string: send text (no content parts).")
        texts.append(item)
    return texts


def _instruction_tokens(data: dict[str, Any]) -> int:
    """The instruction a score template renders into every pair: the top-level field (vLLM
    folds it into the template's kwargs) and the kwargs' own (checked by `request_fields`)."""
    instruction = data.get("instruction")
    if instruction is not None and not isinstance(instruction, str):
        raise _invalid("instruction", "'instruction' must be a string.")
    kwargs = data.get("chat_template_kwargs") or {}
    texts = [instruction, *(kwargs.get(name) for name in SCORE_TEMPLATE_TEXTS)]
    return sum(text_tokens(text) for text in texts if isinstance(text, str))


def _check_count(count: int, max_inputs: int, name: str) -> None:
    if count > max_inputs:
        raise _invalid(name, f"'{name}' holds {count} inputs; at most {max_inputs} are accepted.")


def _invalid(param: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(message, param=param)
