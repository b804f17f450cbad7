"""One metered request, start to end: admit, forward, settle exactly once (DESIGN.md §4).

    await metering.handle("chat", caller, request, receive, send, record)

The body is parsed (400s), the model checked against the key (404), the request admitted or
refused (429 with `Retry-After`) before anything reaches the upstream. An admitted request
goes upstream with the admitted max_tokens and, for streams, with usage always asked for.
When it ends, however it ends, exactly one of these charges it (in a `finally`):

    usage reported                     settle with vLLM's numbers
    client went away                   abort: prompt estimate + the completion seen so far
                                       (streams: one token per event; otherwise unknown,
                                       so the reservation)
    upstream error response / failure  fail: no tokens (nothing was produced)
    before any byte
    stream cut, or an in-band error    abort, as for a client that went away
    no usage in a complete response    settle at the reservation (counted as an error)
"""

from __future__ import annotations

import math
import time

from serving.gateway.asgi import Receive, Send
from serving.gateway.auth import Caller
from serving.gateway.errors import (
    InvalidRequestError,
    ModelNotFoundError,
    RateLimitError,
    UpstreamRejectedError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
)
from serving.gateway.health import ModelCatalog
from serving.gateway.metrics import RequestRecord
from serving.gateway.openai_request import (
    CompletionRequest,
    Kind,
    parse_completion_request,
    render_upstream_body,
)
from serving.gateway.proxy import Proxy, ProxyOutcome, ProxyRequest
from serving.gateway.quota import (
    Admission,
    Lease,
    QuotaEngine,
    Refusal,
    rate_limit_raw_headers,
)
from serving.gateway.quota.limits import scoped_limits
from serving.gateway.usage import ResponseMeter


class Metering:
    def __init__(
        self, engine: QuotaEngine, proxy: Proxy, catalog: ModelCatalog, *, lease_ttl_s: float
    ) -> None:
        self._engine = engine
        self._proxy = proxy
        self._catalog = catalog
        self._renew_every = lease_ttl_s / 3
        self._renewed_at = time.monotonic()
        self._active: set[Lease] = set()

    async def handle(
        self,
        kind: Kind,
        caller: Caller,
        request: ProxyRequest,
        receive: Receive,
        send: Send,
        record: RequestRecord,
    ) -> None:
        parsed = parse_completion_request(kind, request.body)
        record.model = self._catalog.label(parsed.model)
        if not caller.allows_model(parsed.model):
            raise ModelNotFoundError(parsed.model)
        window = self._catalog.context_window(parsed.model)
        if window is not None and parsed.requested_max_tokens is not None:
            scopes = scoped_limits(caller, parsed.model)
            effective = self._engine.allowed_max_tokens(scopes, parsed.requested_max_tokens)
            _check_window(parsed, effective, window)
        decision = self._admit(caller, parsed, window)
        record.headers = rate_limit_raw_headers(decision.rate_limit)
        if isinstance(decision, Refusal):
            record.refusal = decision.reason.value
            raise refusal_error(decision)
        lease = decision.lease
        meter = ResponseMeter(strip_usage=parsed.stream and not parsed.client_wants_usage)
        upstream_request = ProxyRequest(
            request.method,
            request.target,
            request.headers,
            render_upstream_body(parsed, max_tokens=decision.max_tokens),
            request.request_id,
            response_headers=record.headers,
            meter=meter,
        )
        self._active.add(lease)
        outcome: ProxyOutcome | None = None
        try:
            outcome = await self._proxy.forward(upstream_request, receive, send)
        finally:
            self._active.discard(lease)
            self._finish(lease, decision, parsed, meter, outcome, record)
        if outcome is not None and 200 <= (outcome.upstream_status or 0) < 300:
            self._catalog.learn(parsed.model)

    def maintain(self) -> None:
        """Periodic upkeep: renew the leases of running requests, reclaim expired ones,
        persist budgets."""
        now = time.monotonic()
        if now - self._renewed_at >= self._renew_every:
            self._renewed_at = now
            for lease in list(self._active):
                self._engine.renew(lease)
        self._engine.reclaim_expired()
        self._engine.store.flush()

    def _admit(
        self, caller: Caller, parsed: CompletionRequest, window: int | None
    ) -> Admission | Refusal:
        if parsed.choices == 1:
            return self._engine.admit(
                caller,
                parsed.model,
                parsed.prompt_estimate,
                parsed.requested_max_tokens,
                context_window=window,
            )
        # n choices (or a batch of prompts) each generate up to max_tokens: reserve them all.
        max_tokens = self._engine.allowed_max_tokens(
            scoped_limits(caller, parsed.model),
            parsed.requested_max_tokens,
            parsed.longest_prompt_estimate,
            window,
        )
        extra = (parsed.choices - 1) * max_tokens
        return self._engine.admit(caller, parsed.model, parsed.prompt_estimate + extra, max_tokens)

    def _finish(
        self,
        lease: Lease,
        admission: Admission,
        parsed: CompletionRequest,
        meter: ResponseMeter,
        outcome: ProxyOutcome | None,
        record: RequestRecord,
    ) -> None:
        engine = self._engine
        seen: int | None = None
        if parsed.stream:
            seen = min(meter.events, admission.max_tokens * parsed.choices)
        if outcome is not None:
            record.status = outcome.status
            record.forwarded_at = outcome.forwarded_at
            record.first_byte_at = outcome.first_byte_at
            record.upstream_done_at = outcome.upstream_done_at
            record.upstream_error = upstream_error_kind(outcome, meter)
        usage = meter.usage
        if outcome is None:  # cancelled (shutdown) or a bug: nothing is known
            engine.abort(lease, None, seen)
        elif usage is not None:
            engine.settle(lease, usage.prompt_tokens, usage.completion_tokens)
        elif outcome.client_disconnected:
            engine.abort(lease, None, seen)
        elif outcome.upstream_status is None or outcome.upstream_status >= 400:
            engine.fail(lease)
        elif outcome.error is not None or meter.inband_error:
            engine.abort(lease, None, seen)
        else:
            record.upstream_error = record.upstream_error or "missing_usage"
            engine.settle(lease, None, None)
        charged = lease.charged_tokens or 0
        if usage is not None:
            record.prompt_tokens = min(usage.prompt_tokens, charged)
        elif charged:
            record.prompt_tokens = min(lease.prompt_estimate, charged)
        record.completion_tokens = charged - record.prompt_tokens


def upstream_error_kind(outcome: ProxyOutcome, meter: ResponseMeter | None) -> str | None:
    """The `kind` label of gateway_upstream_errors_total for this outcome, if any."""
    error = outcome.error
    status = outcome.upstream_status or 0
    if isinstance(error, UpstreamTimeoutError):
        return "timeout"
    if isinstance(error, UpstreamUnavailableError):
        return "connect"
    if status >= 500:
        return "status_5xx"
    if error is not None and not isinstance(error, UpstreamRejectedError):
        return "reset"
    if meter is not None:
        if meter.inband_error:
            return "in_band"
        return meter.problem
    return None


def refusal_error(refusal: Refusal) -> RateLimitError:
    wait = refusal.retry_after
    if not math.isfinite(wait):
        wait = float(refusal.retry_after_header)
    return RateLimitError(
        refusal.message, error_type=refusal.error_type, code=refusal.code, retry_after_s=wait
    )


def _check_window(parsed: CompletionRequest, effective: int, window: int) -> None:
    """A max_tokens (after the key's cap) beyond the model's context can never be served:
    400 before any quota."""
    if effective <= window:
        return
    requested = parsed.requested_max_tokens
    param = "max_tokens"
    if parsed.kind == "chat" and parsed.data.get("max_completion_tokens") is not None:
        param = "max_completion_tokens"
    raise InvalidRequestError(
        f"{param} is too large: {requested}. This model's maximum context length is "
        f"{window} tokens.",
        param=param,
    )
