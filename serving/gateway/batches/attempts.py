"""A batch line's run as kept in batches.db from before it is sent until its result is
recorded, and what that run may cost at most (its reservation), so a gateway that starts
after one died can charge the runs it cut (docs/batches.md, durability).

    model, prompt, completion = line_reservation(quota, catalog, caller, kind, body, ...)
    store.start_attempt(Attempt(batch_id, line, request_id, key_id, model, prompt, completion))

Rules: the reservation is the one `QuotaEngine.admit` books for the same request (the prompt
estimate, an upper bound, plus max_tokens for each sequence), so charging it covers what the
engine can have counted, as an expired lease's charge does; a body the interactive checks
refuse costs nothing (it is refused before anything is sent).
"""

from __future__ import annotations

from dataclasses import dataclass

from serving.gateway.auth import Caller
from serving.gateway.catalog import ModelCatalog
from serving.gateway.completions import served_model
from serving.gateway.errors import GatewayError
from serving.gateway.images import ImagePolicy
from serving.gateway.metrics import NONE
from serving.gateway.openai_request import parse_completion_request
from serving.gateway.quota import QuotaEngine
from serving.gateway.quota.limits import scoped_limits
from serving.gateway.request_fields import Kind


@dataclass(frozen=True, slots=True)
class Attempt:
    """One run of a line, sent or about to be; its tokens are the reservation's parts."""

    batch_id: str
    line: int
    request_id: str
    key_id: str
    model: str
    prompt_tokens: int
    """The prompt estimate, with the completions of every sequence past the first."""
    completion_tokens: int
    """max_tokens as admitted."""


def line_reservation(
    quota: QuotaEngine,
    catalog: ModelCatalog,
    caller: Caller,
    kind: Kind,
    body: bytes,
    *,
    images: ImagePolicy,
    max_inputs: int | None,
    retry_after_s: float,
) -> tuple[str, int, int]:
    """(the model's label, prompt part, completion part) of what admitting the line reserves;
    nothing for a line the interactive checks refuse before it is sent."""
    try:
        parsed = parse_completion_request(kind, body, images=images, max_inputs=max_inputs)
        model = served_model(caller, parsed.model, catalog, retry_after_s=retry_after_s)
    except GatewayError:
        return NONE, 0, 0
    max_tokens = quota.allowed_max_tokens(
        scoped_limits(caller, model),
        parsed.requested_max_tokens,
        parsed.longest_prompt_estimate,
        catalog.context_window(model),
    )
    prompt = parsed.prompt_estimate + (parsed.choices - 1) * max_tokens
    return catalog.label(model), prompt, max_tokens
