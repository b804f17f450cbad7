"""vLLM's pooling engines against the same models in plain PyTorch (transformers), as the model
cards compute them: an embedding is the last token's final hidden state, L2-normalised
(Qwen3-Embedding); a relevance score is sigmoid(logit("yes") - logit("no")) at the end of the
reranker's prompt (Qwen3-Reranker).

Tolerance: both sides run in float32 (the profiles' dtype) on the same bf16 weights, so only
the order of float32 sums differs (vLLM's CPU GEMM and attention kernels against torch's);
seen: embeddings within 1e-7 per component, scores within 1e-8. 1e-5 per component and 1e-6
per score stay far below what a mistake costs: the first token's or the mean hidden state
instead of the last moves components by 0.4 or more, a missing <|endoftext|> by 0.15, and a
prompt one newline short (the template rendered without its last newline) moves a score by
1e-5 to 5e-4.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

from serving.models.cached_build import Progress
from serving.models.tiny_embedding import ensure_tiny_embedding
from serving.models.tiny_reranker import NO, YES, ensure_tiny_reranker
from serving.profiles import load_profile
from serving.profiles.pooling import template_path
from tests.integration.conftest import EMBEDDING_MODEL, RERANKER_MODEL, Stack

EMBEDDING_TOLERANCE = 1e-5
SCORE_TOLERANCE = 1e-6
QUIET = Progress(quiet=True)
TEXTS = (
    "The weather is nice today.",
    "Instruct: Given a web search query, retrieve relevant passages that answer the query\n"
    "Query:Will it rain tomorrow?",
    "Boats came in at dusk and the harbour lights went on one by one.",
)
QUERY = "What is the weather like?"
DOCUMENTS = ("The weather is sunny today.", "Cook the pasta in salted water.", "no")


@pytest.fixture(scope="module")
def no_grad() -> Iterator[None]:
    with torch.inference_mode():
        yield


def post(url: str, path: str, body: dict[str, object]) -> Any:
    response = httpx.post(f"{url}{path}", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def test_embeddings_are_the_last_tokens_hidden_state_normalised(
    pooling_stack: Stack, no_grad: None
) -> None:
    directory: Path = ensure_tiny_embedding(progress=QUIET)  # what the engine serves: cached
    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModel.from_pretrained(directory, dtype=torch.float32).eval()
    with pooling_stack.off_the_books():
        answer = post(
            pooling_stack.engines[0],
            "/v1/embeddings",
            {"model": EMBEDDING_MODEL, "input": list(TEXTS)},
        )
    served = torch.tensor([item["embedding"] for item in answer["data"]])
    expected, tokens = [], 0
    for text in TEXTS:
        ids = tokenizer(text, return_tensors="pt")["input_ids"]
        assert ids[0, -1] == tokenizer.convert_tokens_to_ids("<|endoftext|>")
        tokens += ids.shape[1]
        last = model(input_ids=ids).last_hidden_state[0, -1]
        expected.append(torch.nn.functional.normalize(last, dim=0))
    reference = torch.stack(expected)
    assert served.shape == reference.shape == (len(TEXTS), model.config.hidden_size)
    assert torch.allclose(served.norm(dim=1), torch.ones(len(TEXTS)), atol=1e-5)
    assert (served - reference).abs().max().item() < EMBEDDING_TOLERANCE
    assert answer["usage"]["prompt_tokens"] == tokens


def test_rerank_scores_are_the_yes_no_logits_of_the_templated_prompt(
    pooling_stack: Stack, no_grad: None
) -> None:
    directory = ensure_tiny_reranker(progress=QUIET)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    chat_template = load_profile("cpu-tiny-reranker").chat_template
    assert chat_template is not None
    template = Path(template_path(chat_template)).read_text(encoding="utf-8")
    no, yes = tokenizer.convert_tokens_to_ids([NO, YES])
    expected, tokens = [], 0
    for document in DOCUMENTS:
        messages = [{"role": "query", "content": QUERY}, {"role": "document", "content": document}]
        prompt = tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False)
        assert isinstance(prompt, str) and prompt.endswith("</think>\n\n")  # Qwen's suffix
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        tokens += ids.shape[1]
        logits = model(input_ids=ids).logits[0, -1]
        expected.append(torch.sigmoid(logits[yes] - logits[no]).item())
    with pooling_stack.off_the_books():
        answer = post(
            pooling_stack.engines[1],
            "/v1/rerank",
            {"model": RERANKER_MODEL, "query": QUERY, "documents": list(DOCUMENTS)},
        )
    served = {item["index"]: item["relevance_score"] for item in answer["results"]}
    assert sorted(served) == list(range(len(DOCUMENTS)))
    for index, score in enumerate(expected):
        assert abs(served[index] - score) < SCORE_TOLERANCE, (DOCUMENTS[index], served, expected)
    assert answer["usage"]["prompt_tokens"] == tokens
