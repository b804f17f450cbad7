"""The prompt bound of the pooling routes (embeddings, score, rerank): what each form costs,
what is refused, and the bound held against what vLLM's own code counts with the tiny
tokenizers (plain, and appending EOS as the embedding model's does)."""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.gateway.errors import InvalidRequestError
from serving.gateway.openai_request import parse_completion_request, render_upstream_body
from serving.gateway.pooling_request import INPUT_SPECIAL_TOKENS, PAIR_TOKENS, text_tokens
from serving.gateway.request_fields import Kind

SPECIAL = INPUT_SPECIAL_TOKENS
ASK = [{"role": "user", "content": "hi"}]
# vLLM's model config as its tokenize and score paths read it, for a text-only model.
MODEL_CONFIG: Any = types.SimpleNamespace(
    max_model_len=1 << 20, pooler_config=None, encoder_config=None,
    hf_config=types.SimpleNamespace(), multimodal_config=None, is_multimodal_model=False,
    enable_prompt_embeds=False,
)  # fmt: skip


def estimate(kind: Kind, **fields: Any) -> int:
    return bounded(kind, 2048, fields)


def bounded(kind: Kind, max_inputs: int, fields: dict[str, Any]) -> int:
    body = json.dumps({"model": "m", **fields}).encode()
    return parse_completion_request(kind, body, max_inputs=max_inputs).prompt_estimate


def param_of(kind: Kind, **fields: Any) -> str | None:
    with pytest.raises(InvalidRequestError) as caught:
        estimate(kind, **fields)
    return caught.value.param


# -- what each form costs -------------------------------------------------------------------


def test_text_costs_its_nfc_bytes_and_the_special_tokens() -> None:
    assert estimate("embeddings", input="hello") == 5 + SPECIAL
    assert estimate("embeddings", input=["ab", "cde"]) == 2 + 3 + 2 * SPECIAL
    # NFC decomposes U+0958 into two characters of three bytes each: six tokens, not three
    assert text_tokens("\u0958") == 6 and text_tokens("\U0001d160") == 12
    assert text_tokens("e\u0301") == 2  # composed: what the tokenizer sees


def test_token_ids_cost_their_count() -> None:
    assert estimate("embeddings", input=[5, 6, 7]) == 3
    assert estimate("embeddings", input=[[5, 6], [7]]) == 3


def test_a_conversation_costs_the_chat_estimate() -> None:
    one = estimate("embeddings", messages=ASK)
    assert one == estimate("embeddings", input=ASK) > len("hi") + SPECIAL
    assert estimate("embeddings", messages=[ASK, ASK]) == 2 * one
    kwargs = {"chat_template_kwargs": {"documents": [{"text": "x" * 300}]}}
    assert estimate("embeddings", messages=ASK, **kwargs) > one + 300


def test_a_pair_costs_both_texts_the_instruction_and_the_template() -> None:
    assert estimate("rerank", query="q", documents=["ab", "c"]) == 2 * (1 + PAIR_TOKENS) + 3
    assert estimate("score", queries=["q1", "q22"], documents=["a", "b"]) == (
        2 + 3 + 2 + 2 * PAIR_TOKENS
    )
    plain = estimate("score", text_1="q", text_2=["a", "b", "c"])
    assert plain == 3 * (2 + PAIR_TOKENS)
    # the instruction renders into every pair, top-level or as a template kwarg
    assert estimate("score", text_1="q", text_2=["a", "b", "c"], instruction="i" * 10) == plain + 30
    kwargs = {"chat_template_kwargs": {"instruction": "i" * 10, "instruct": "j"}}
    assert estimate("score", text_1="q", text_2=["a", "b", "c"], **kwargs) == plain + 33
    for form in (("queries", "items"), ("data_1", "data_2")):
        assert estimate("score", **{form[0]: "q", form[1]: ["a", "b", "c"]}) == plain


def test_a_pooling_request_reserves_no_generation_and_is_sent_as_written() -> None:
    body = json.dumps({"model": "m", "input": "hi", "dimensions": 4}).encode()
    request = parse_completion_request("embeddings", body)
    assert (request.requested_max_tokens, request.choices, request.stream) == (0, 1, False)
    assert render_upstream_body(request, max_tokens=0) == body
    sent = json.loads(render_upstream_body(request, max_tokens=0, model="other", priority=2))
    assert sent == {"model": "other", "input": "hi", "dimensions": 4, "priority": 2}


# -- what is refused, before anything is reserved -------------------------------------------


@pytest.mark.parametrize(
    ("kind", "fields", "param"),
    [
        ("embeddings", {"input": "a", "messages": ASK}, "messages"),
        ("embeddings", {}, "input"),
        ("embeddings", {"input": []}, "input"),
        ("embeddings", {"input": 5}, "input"),
        ("embeddings", {"input": ["a", 5]}, "input[1]"),
        ("embeddings", {"input": [1, -2]}, "input[1]"),
        ("embeddings", {"input": [[1], [2, "x"]]}, "input[1][1]"),
        ("embeddings", {"input": [[1], []]}, "input[1]"),
        ("embeddings", {"messages": [ASK, "x"]}, "messages[1]"),
        ("embeddings", {"input": [{"role": "user", "content": "a"}, 3]}, "input"),
        (
            "embeddings",
            {"input": [[{"role": "user", "content": [{"type": "image_url", "image_url": {
                "url": "data:image/png;base64,AAAA"}}]}]]},
            "input[0][0].content[0]",
        ),
        ("embeddings", {"input": "a", "chat_template_kwargs": {"system": "x"}},
         "chat_template_kwargs.system"),
        ("rerank", {"query": ["q"], "documents": ["a"]}, "query"),
        ("rerank", {"query": "q", "documents": []}, "documents"),
        ("rerank", {"query": "q", "documents": ["a", {"content": []}]}, "documents[1]"),
        ("rerank", {"query": "q", "documents": "a", "instruction": 3}, "instruction"),
        ("rerank", {"query": "q", "documents": "a", "chat_template_kwargs": {"x": "y"}},
         "chat_template_kwargs.x"),
        ("rerank", {"query": "q", "documents": "a", "chat_template_kwargs": {"instruction": 1}},
         "chat_template_kwargs.instruction"),
        ("score", {"queries": ["a", "b"], "documents": ["c", "d", "e"]}, "documents"),
        ("score", {"queries": "a", "documents": "b", "text_2": "c"}, "text_2"),
        ("score", {"queries": "a"}, "queries"),
        ("score", {}, "queries"),
    ],
)  # fmt: skip
def test_bodies_that_cannot_be_bounded_are_400s_naming_the_field(
    kind: Kind, fields: dict[str, Any], param: str
) -> None:
    assert param_of(kind, **fields) == param


@pytest.mark.parametrize(
    ("kind", "fields", "param"),
    [
        ("embeddings", {"input": ["a"] * 5}, "input"),
        ("embeddings", {"input": [[1]] * 5}, "input"),
        ("embeddings", {"messages": [ASK] * 5}, "messages"),
        ("rerank", {"query": "q", "documents": ["a"] * 5}, "documents"),
        ("score", {"data_1": ["q"] * 5, "data_2": ["a"] * 5}, "data_2"),
    ],
)
def test_batches_are_bounded(kind: Kind, fields: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        bounded(kind, 4, fields)
    assert caught.value.param == param and "at most 4" in caught.value.message
    fields = {
        name: value[:4] if isinstance(value, list) else value for name, value in fields.items()
    }
    assert bounded(kind, 4, fields) > 0


# -- the bound against vLLM's own count ------------------------------------------------------


@pytest.fixture(scope="module", params=["plain", "appending EOS"])
def vllm_tokenizer(request: pytest.FixtureRequest, tokenizer: Any, tmp_path_factory: Any) -> Any:
    """The tiny test tokenizer as vLLM wraps it; also in the embedding model's form, which
    appends EOS to every input (`serving.models.tiny_embedding`)."""
    from transformers import AutoTokenizer
    from vllm.tokenizers.hf import get_cached_tokenizer

    from serving.models.tiny_embedding import appending_eos

    if request.param == "plain":
        return get_cached_tokenizer(tokenizer)
    out: Path = tmp_path_factory.mktemp("eos")
    tokenizer.save_pretrained(out)
    path = out / "tokenizer.json"
    path.write_text(appending_eos(path.read_text(encoding="utf-8")), encoding="utf-8")
    return get_cached_tokenizer(AutoTokenizer.from_pretrained(out))


def reranker_template() -> str:
    from serving.profiles.pooling import template_path

    return Path(template_path("builtin:qwen3-reranker")).read_text(encoding="utf-8")


# NFC expansions, combining marks, wide and astral characters, special tokens as text.
ODD = "\u0958\U0001d160\ufb2c\u0301é中🙂İ\u0000"
pieces = st.characters(codec="utf-8") | st.sampled_from([*ODD, "<|im_end|>", " the"])
texts = st.lists(pieces, max_size=24).map("".join)


def vllm_embedding_tokens(tokenizer: Any, body: dict[str, Any]) -> int:
    """usage.prompt_tokens as vLLM counts it for a body of texts or token ids: each input
    through the request's tokenize params (pooling/base/protocol.py), then
    get_pooling_usage."""
    from vllm.entrypoints.pooling.embed.protocol import EmbeddingCompletionRequest
    from vllm.entrypoints.pooling.utils import get_pooling_usage
    from vllm.outputs import PoolingRequestOutput

    request = EmbeddingCompletionRequest.model_validate(body)
    params = request.build_tok_params(MODEL_CONFIG)
    given = request.input
    inputs = [given] if isinstance(given, str) or isinstance(given[0], int) else given
    outputs: list[Any] = []
    for one in inputs:
        if isinstance(one, str):
            text = params.apply_pre_tokenization(tokenizer, {"prompt": one})["prompt"]
            ids = tokenizer(text, **params.get_encode_kwargs())["input_ids"]
        else:
            ids = list(one)
        ids = params.apply_post_tokenization(tokenizer, {"prompt_token_ids": ids})
        outputs.append(PoolingRequestOutput("r", None, ids["prompt_token_ids"], 0, True))
    return get_pooling_usage(outputs).prompt_tokens


@settings(max_examples=40, deadline=None)
@given(given=texts | st.lists(texts, min_size=1, max_size=3))
def test_embeddings_bound_what_vllm_counts(vllm_tokenizer: Any, given: Any) -> None:
    body = {"model": "m", "input": given}
    assert vllm_embedding_tokens(vllm_tokenizer, body) <= estimate("embeddings", input=given)


def test_token_ids_are_counted_as_vllm_counts_them(vllm_tokenizer: Any) -> None:
    body = {"model": "m", "input": [[5, 6, 7], [8]]}
    assert vllm_embedding_tokens(vllm_tokenizer, body) == estimate("embeddings", **body) == 4


@settings(max_examples=20, deadline=None)
@given(turns=st.lists(st.tuples(st.sampled_from(["user", "assistant", "system"]), texts),
                      min_size=1, max_size=3))  # fmt: skip
def test_a_conversation_bounds_what_its_template_renders(
    vllm_tokenizer: Any, turns: list[tuple[str, str]]
) -> None:
    """vLLM renders the chat form with the model's template (no generation prompt by
    default), then tokenizes it, with the tokenizer's special tokens when asked."""
    from vllm.renderers.hf import safe_apply_chat_template

    messages: list[Any] = [{"role": role, "content": text} for role, text in turns]
    rendered = safe_apply_chat_template(
        MODEL_CONFIG,
        vllm_tokenizer,
        messages,
        chat_template=vllm_tokenizer.chat_template,
        tokenize=False,
        add_generation_prompt=False,
    )
    ids = vllm_tokenizer(rendered, add_special_tokens=True)["input_ids"]
    assert len(ids) <= estimate("embeddings", messages=messages, add_special_tokens=True)


def scoring_tokens(tokenizer: Any, form: str, queries: list[str], documents: list[str],
                   instruction: str | None) -> int:  # fmt: skip
    """usage.prompt_tokens as vLLM counts a score or rerank request on each kind of model:
    `bi-encoder` (an embedding model: both texts embedded, vLLM's pad between them),
    `cross-encoder` (the pair as the tokenizer's text pair), `concatenated` (an LLM as
    reranker without a separator), `template` (the Qwen3 reranker's score template)."""
    from vllm.entrypoints.pooling.scoring.io_processor import (
        BiEncoderIOProcessor,
        CrossEncoderIOProcessor,
    )
    from vllm.entrypoints.pooling.utils import get_pooling_usage
    from vllm.outputs import PoolingRequestOutput

    firsts = queries * len(documents) if len(queries) == 1 else queries
    pairs = list(zip(firsts, documents, strict=True))
    encode = {"add_special_tokens": True}  # ScoringRequestMixin.build_tok_params
    if form == "bi-encoder":
        import torch

        def embedded(text: str) -> Any:
            ids = tokenizer(text, **encode)["input_ids"]
            return PoolingRequestOutput(
                "r", types.SimpleNamespace(data=torch.ones(2)), ids, 0, True
            )

        outputs = [embedded(text) for text in queries + documents]
        bi = object.__new__(BiEncoderIOProcessor)  # what _post_process reads, set below
        bi.pad_token_id = tokenizer.pad_token_id
        pooled = bi._post_process(outputs, n_queries=len(queries))
        return get_pooling_usage(pooled).prompt_tokens
    cross = object.__new__(CrossEncoderIOProcessor)  # what get_score_prompt reads, set below
    cross.model_config = MODEL_CONFIG
    cross.tokenizer, cross.supports_score_template, cross.model = tokenizer, False, None
    cross.use_sep_token = form == "cross-encoder"
    template = reranker_template() if form == "template" else None
    kwargs = {"instruction": instruction} if instruction is not None else None
    total = 0
    for query, document in pairs:
        _, prompt = cross.get_score_prompt(
            query, document, encode_kwargs=encode, chat_template=template,
            chat_template_kwargs=kwargs,
        )  # fmt: skip
        total += len(prompt["prompt_token_ids"])
    return total


@settings(max_examples=25, deadline=None)
@given(
    form=st.sampled_from(["bi-encoder", "cross-encoder", "concatenated", "template"]),
    queries=st.lists(texts, min_size=1, max_size=2),
    documents=st.lists(texts, min_size=2, max_size=2),
    instruction=st.none() | texts,
)
def test_pairs_bound_what_vllm_counts(
    vllm_tokenizer: Any, form: str, queries: list[str], documents: list[str],
    instruction: str | None,
) -> None:  # fmt: skip
    counted = scoring_tokens(vllm_tokenizer, form, queries, documents, instruction)
    body: dict[str, Any] = {"queries": queries, "documents": documents}
    if instruction is not None:
        body["instruction"] = instruction
    assert counted <= estimate("score", **body)
    if len(queries) == 1:
        rerank = {"query": queries[0], "documents": documents, "instruction": instruction}
        assert counted <= estimate("rerank", **rerank)


def test_pair_tokens_hold_the_reranker_template_for_any_byte_level_tokenizer(
    tokenizer: Any,
) -> None:
    """The template's fixed text (empty query and document, its default instruction) in
    UTF-8 bytes bounds its tokens for every byte-level BPE; the special tokens a tokenizer
    adds to the pair, and a bi-encoder's two inputs with vLLM's pad, fit beside it."""
    from vllm.renderers.hf import safe_apply_chat_template

    pair: list[Any] = [{"role": "query", "content": ""}, {"role": "document", "content": ""}]
    fixed = safe_apply_chat_template(
        MODEL_CONFIG,
        tokenizer,
        pair,
        chat_template=reranker_template(),
        tokenize=False,
    )
    assert "Given a web search query" in fixed and fixed.rstrip().endswith("</think>")
    assert len(fixed.encode()) + INPUT_SPECIAL_TOKENS <= PAIR_TOKENS
    assert 2 * INPUT_SPECIAL_TOKENS + 1 <= PAIR_TOKENS
