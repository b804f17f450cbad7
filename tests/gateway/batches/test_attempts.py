"""A line's reservation is what admitting the same request reserves (its cut run's charge
covers what the engine can have counted), and a body refused before it is sent costs
nothing."""

from __future__ import annotations

import asyncio
import json

import pytest

from serving.gateway.auth import Principal
from serving.gateway.batches.attempts import line_reservation
from serving.gateway.catalog import ModelCatalog, ModelInfo
from serving.gateway.images import ImagePolicy
from serving.gateway.metrics import NONE
from serving.gateway.openai_request import parse_completion_request
from serving.gateway.quota import Admission, InMemoryQuotaStore, Limits, QuotaEngine

WINDOW = 64


def _catalog() -> ModelCatalog:
    catalog = ModelCatalog()
    catalog.update(0, {"qwen": ModelInfo(window=WINDOW, parent=None, entry={"id": "qwen"})})
    return catalog


def _body(**fields: object) -> bytes:
    message = {"role": "user", "content": "How far is the moon?"}
    return json.dumps({"model": "qwen", "messages": [message], **fields}).encode()


def _reservation(caller: Principal, body: bytes) -> tuple[str, int, int]:
    quota = QuotaEngine(InMemoryQuotaStore(), default_max_tokens=1000)
    return line_reservation(
        quota, _catalog(), caller, "chat", body,
        images=ImagePolicy.defaults(), max_inputs=8, retry_after_s=1,
    )  # fmt: skip


def _admitted(caller: Principal, body: bytes) -> int:
    """What `QuotaEngine.admit` reserves for the body, as `Completions._admit` calls it."""
    quota = QuotaEngine(InMemoryQuotaStore(), default_max_tokens=1000)
    parsed = parse_completion_request("chat", body, images=ImagePolicy.defaults())
    admission = asyncio.run(
        quota.admit(
            caller, "qwen", parsed.prompt_estimate, parsed.requested_max_tokens,
            context_window=WINDOW, choices=parsed.choices,
            longest_prompt_estimate=parsed.longest_prompt_estimate,
        )
    )  # fmt: skip
    assert isinstance(admission, Admission)
    return admission.lease.reserved_tokens


@pytest.mark.parametrize(
    ("caller", "fields"),
    [
        (Principal("k"), {"max_tokens": 8}),
        (Principal("k"), {"max_tokens": 8, "n": 3}),
        (Principal("k"), {}),  # no max_tokens: the context window's room
        (Principal("k", limits=Limits(max_tokens=5)), {"max_tokens": 8}),  # the key's cap
    ],
)
def test_the_reservation_is_what_admission_reserves(
    caller: Principal, fields: dict[str, object]
) -> None:
    body = _body(**fields)
    model, prompt, completion = _reservation(caller, body)
    assert model == "qwen" and prompt > 0 and completion > 0
    assert prompt + completion == _admitted(caller, body)


def test_a_body_refused_before_it_is_sent_reserves_nothing() -> None:
    assert _reservation(Principal("k"), _body(max_tokens=-1)) == (NONE, 0, 0)
    assert _reservation(Principal("k"), b"not json") == (NONE, 0, 0)
