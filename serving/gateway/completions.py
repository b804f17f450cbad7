"""The request logic of the metered routes (chat completions, completions, Responses,
Anthropic Messages, and the pooling routes: embeddings, score, rerank), top to bottom:
parse, admit, check, wait for a slot, forward, settle (docs/architecture.md, the request
path; what each ending is charged: docs/gateway.md, charging rules).

    await completions.handle("chat", caller, request, receive, send, record)

From admission on, a `HeldRequest` owns the lease, queue turn, meter and outcome, and one
`finally` (`_release`) gives them back, whatever raises; a lease is settled exactly once.
The app's lease upkeep calls `renew_leases`, so a stream longer than the lease TTL keeps
its slot.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from serving.gateway.auth import Caller
from serving.gateway.catalog import ModelCatalog
from serving.gateway.errors import (
    EngineBusyError,
    InvalidRequestError,
    ModelNotFoundError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
    refusal_error,
    upstream_error_kind,
)
from serving.gateway.fair_queue import FairQueue, QueueTimeout, Turn, in_lowest_class
from serving.gateway.images import ImagePolicy
from serving.gateway.keys.record import MAX_PRIORITY
from serving.gateway.metrics import RequestRecord
from serving.gateway.openai_request import (
    CompletionRequest,
    Kind,
    check_admitted,
    parse_completion_request,
    render_upstream_body,
)
from serving.gateway.proxy import Proxy, ProxyOutcome, ProxyRequest
from serving.gateway.quota import Admission, Lease, QuotaEngine, Refusal
from serving.gateway.quota.engine import BeyondContext
from serving.gateway.request_fields import POOLING
from serving.gateway.routing import Engine, prefix_hashes, prompt_text
from serving.gateway.types import Receive, Send
from serving.gateway.usage import ResponseMeter

# vLLM runs a larger priority later: a batch line's is past every key's class, so with
# priority scheduling the engine too serves (and keeps) interactive requests first.
BATCH_PRIORITY = MAX_PRIORITY + 1


def served_model(caller: Caller, model: str, catalog: ModelCatalog, *, retry_after_s: float) -> str:
    """The model a request is served by: the model it names, except that a key with a
    default adapter never reaches a base model. For such a key a name the engines list as
    an adapter is served as named, a base model (listed without a parent) by the key's
    adapter, and anything else is refused, since the catalog cannot tell it from a base
    model: 503 before any engine's list was read or while no engine lists the adapter, 404
    for a name no engine lists (docs/adapters.md, keys and adapters)."""
    adapter = caller.default_adapter
    if adapter is None or model == adapter or catalog.base_model(model) is not None:
        return model
    if not catalog.known:
        raise UpstreamUnavailableError(
            "No model server's model list has been read yet; retry later.",
            retry_after_s=retry_after_s,
        )
    if not catalog.is_base(model):
        raise ModelNotFoundError(model)
    if catalog.engines_serving(adapter) is None:
        raise UpstreamUnavailableError(
            f"The adapter `{adapter}` that serves this key is not loaded on any model server "
            "yet; retry later.",
            retry_after_s=retry_after_s,
        )
    return adapter


@dataclass(slots=True)
class HeldRequest:
    """What one admitted request holds until `Completions._release` gives it back."""

    admission: Admission
    record: RequestRecord
    turn: Turn | None = None
    meter: ResponseMeter | None = None
    outcome: ProxyOutcome = field(default_factory=ProxyOutcome)
    forwarded: bool = False
    """The request was handed to the proxy: the engine may have worked on it."""
    relayed: bool = False
    """The proxy returned: `outcome` says how the exchange ended."""

    def __post_init__(self) -> None:
        self.record.exchange = self.outcome  # the error boundary reads whether it started


class Completions:
    def __init__(
        self,
        quota: QuotaEngine,
        proxy: Proxy,
        catalog: ModelCatalog,
        images: ImagePolicy | None = None,
        *,
        queue: FairQueue | None = None,
        retry_after_s: int,
        engine_priority: bool = False,
        stream_interval: int,
        max_pooling_inputs: int | None = None,
    ) -> None:
        self._quota = quota
        self._proxy = proxy
        self._catalog = catalog
        self.images = images or ImagePolicy.defaults()
        self._queue = queue
        self._retry_after_s = retry_after_s
        self._engine_priority = engine_priority
        self._stream_interval = stream_interval
        self._max_pooling_inputs = max_pooling_inputs
        self._leases_running: set[Lease] = set()

    async def handle(
        self,
        kind: Kind,
        caller: Caller,
        request: ProxyRequest,
        receive: Receive,
        send: Send,
        record: RequestRecord,
    ) -> None:
        parsed = parse_completion_request(
            kind, request.body, images=self.images, max_inputs=self._max_pooling_inputs
        )
        model = served_model(caller, parsed.model, self._catalog, retry_after_s=self._retry_after_s)
        record.model = self._catalog.label(model)
        if not caller.allows_model(model):
            raise ModelNotFoundError(parsed.model)
        admission = await self._admit(caller, model, parsed, record)
        # From here the request holds a lease: `held` owns it (and its queue turn, meter and
        # outcome), and the one `finally` below gives back whatever it holds, however the
        # request ends, exceptions included.
        held = HeldRequest(admission, record)
        try:
            self._leases_running.add(admission.lease)  # renewed by the lease upkeep while it runs
            check_admitted(parsed)  # after admission: a key at its limit costs no schema work
            if self._queue is not None:
                held.turn = await self._wait(self._queue, caller, parsed, admission, receive)
            upstream_request = self._upstream_request(caller, model, parsed, admission, request)
            held.meter = upstream_request.meter
            held.forwarded = True
            await self._proxy.forward(upstream_request, receive, send, held.outcome)
            held.relayed = True
        finally:
            self._leases_running.discard(admission.lease)
            await self._release(held, parsed)
        if 200 <= (held.outcome.upstream_status or 0) < 300:
            self._catalog.learn(model)

    async def _admit(
        self, caller: Caller, model: str, parsed: CompletionRequest, record: RequestRecord
    ) -> Admission:
        """One reservation for all n choices (or a batch's prompts), or the refusal raised."""
        try:
            admission = await self._quota.admit(
                caller,
                model,
                parsed.prompt_estimate,
                parsed.requested_max_tokens,
                context_window=self._catalog.context_window(model),
                choices=parsed.choices,
                longest_prompt_estimate=parsed.longest_prompt_estimate,
            )
        except BeyondContext as exc:
            raise _beyond_context(parsed, exc) from None
        if isinstance(admission, Refusal):
            record.refusal = admission.reason.value
            raise refusal_error(admission)
        return admission

    async def _wait(
        self,
        queue: FairQueue,
        caller: Caller,
        parsed: CompletionRequest,
        admission: Admission,
        receive: Receive,
    ) -> Turn:
        """The request's engine slots: one per sequence vLLM will run (n x prompts; one for
        a pooling request, whose inputs are a forward pass each, nothing decoded)."""
        seats = parsed.choices
        if seats > queue.per_key:
            raise _too_wide(parsed, queue.per_key)
        cost = parsed.prompt_estimate + admission.max_tokens * parsed.choices
        weight = caller.weight
        turn = queue.try_turn(caller.key_id, cost=cost, seats=seats, weight=weight)
        if turn is not None:
            return turn
        try:
            return await queue.turn(
                caller.key_id,
                cost=cost,
                seats=seats,
                weight=weight,
                gone=lambda: _client_gone(receive),
            )
        except QueueTimeout:
            raise EngineBusyError(
                f"No engine slot came free within {queue.timeout_s:g} s; "
                "retry later. Nothing was charged.",
                retry_after_s=self._retry_after_s,
            ) from None

    def _upstream_request(
        self,
        caller: Caller,
        model: str,
        parsed: CompletionRequest,
        admission: Admission,
        request: ProxyRequest,
    ) -> ProxyRequest:
        """The request as the engine gets it (the admitted max_tokens, usage asked for in
        streams), with the meter that reads its response and, with affinity routing, the
        prompt's prefixes."""
        usage_chunks = parsed.usage_upstream
        interval = self._stream_interval if usage_chunks else 1  # chat and completion streams
        meter = ResponseMeter(
            strip_usage=usage_chunks and not parsed.client_wants_usage,
            chunk_usage=usage_chunks,
            strip_chunk_usage=usage_chunks and not parsed.client_wants_running_usage,
            tokens_per_event=interval,
            responses=parsed.kind == "responses",
            messages=parsed.kind == "messages",
            pooling=parsed.kind in POOLING,
        )
        prefixes: list[int] = []
        if self._proxy.router.wants_prefixes:
            text = prompt_text(parsed.kind, parsed.data)
            prefixes = prefix_hashes(text) if text else []
        return ProxyRequest(
            request.method,
            request.target,
            request.headers,
            render_upstream_body(
                parsed,
                max_tokens=admission.max_tokens,
                model=model,
                priority=self._priority(caller),
                stream_interval=interval,
            ),
            request.request_id,
            response_headers=request.dialect.rate_limit_headers(admission.rate_limit),
            meter=meter,
            prefixes=prefixes,
            engines=self._catalog.engines_serving(model),
            dialect=request.dialect,
        )

    def _priority(self, caller: Caller) -> int:
        """vLLM's priority for the request, with --engine-priority: the key's class, or
        `BATCH_PRIORITY` for a batch line (a request of the fair queue's lowest class)."""
        if not self._engine_priority:
            return 0
        return BATCH_PRIORITY if in_lowest_class() else caller.priority

    async def _release(self, held: HeldRequest, parsed: CompletionRequest) -> None:
        """Give back what `held` holds: the lease settled (or withdrawn when the engine never
        saw the request), the queue turn returned, the outcome recorded; each even when an
        earlier one raised."""
        lease = held.admission.lease
        try:
            if held.forwarded and held.meter is not None:
                await self._settle(held, parsed, held.meter)
            else:
                await self._quota.withdraw(lease)
        except BaseException:
            # Settling raised: the lease ends at its reservation (an upper bound) if the
            # store still answers; if not, it is no longer renewed and expires at its TTL,
            # charged the same.
            with contextlib.suppress(Exception):
                await self._quota.abort(lease, None, None)
            raise
        finally:
            try:
                if held.turn is not None and self._queue is not None:
                    self._queue.release(held.turn, served=lease.charged_tokens)
            finally:
                meter = held.meter or ResponseMeter(strip_usage=False)
                outcome = held.outcome if held.forwarded else None
                _record_outcome(held.record, lease, parsed, meter, outcome)
                if outcome is not None and outcome.engine is not None:
                    _account(outcome.engine, held.record, parsed, cut=meter.usage is None)

    def models_listing(self, caller: Caller) -> dict[str, object]:
        """`/v1/models` for `caller`: what the engines serve that the key may use."""
        return {"object": "list", "data": self._catalog.listing(caller.allows_model)}

    async def renew_leases(self) -> None:
        """Renew the leases of the requests running now."""
        for lease in list(self._leases_running):
            if lease in self._leases_running:  # it may have ended while an earlier renewal waited
                await self._quota.renew(lease)

    async def _settle(
        self, held: HeldRequest, parsed: CompletionRequest, meter: ResponseMeter
    ) -> None:
        quota, lease, outcome = self._quota, held.admission.lease, held.outcome
        usage = meter.usage
        if usage is not None:
            await quota.settle(lease, usage.prompt_tokens, usage.completion_tokens)
        elif (
            (not held.relayed and outcome.error is None)  # shutdown, a bug
            or outcome.client_disconnected
            # The engine had the request and may have worked on it until the gateway gave
            # up waiting: what it could have produced is charged, as for an abort.
            or (isinstance(outcome.error, UpstreamTimeoutError) and outcome.forwarded_at)
        ):
            await quota.abort(lease, *_cut_charge(held, parsed, meter))
        elif outcome.upstream_status is None or outcome.upstream_status >= 400:
            await quota.fail(lease)
        elif outcome.error is not None or meter.inband_error:
            await quota.abort(lease, *_cut_charge(held, parsed, meter))
        else:
            await quota.settle(lease, None, None)


async def _client_gone(receive: Receive) -> None:
    """Returns when the client disconnects (its body was read: nothing else can come)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def _cut_charge(
    held: HeldRequest, parsed: CompletionRequest, meter: ResponseMeter
) -> tuple[int, int]:
    """The prompt and completion tokens an aborted request is charged: its prompt and what
    was generated; in a stream, vLLM's running count as far as it was read
    (`ResponseMeter.streamed_tokens`); otherwise (or when vLLM ran on past the last read)
    every choice's whole max_tokens, all of which the engine may have produced."""
    seen = held.admission.max_tokens * parsed.choices
    streamed = meter.streamed_tokens(parsed.choices) if parsed.stream else None
    if streamed is not None:
        seen = min(streamed, seen)
    return _cut_prompt(parsed, meter), seen


def _cut_prompt(parsed: CompletionRequest, meter: ResponseMeter) -> int:
    """The prompt tokens a request without a final usage is charged: vLLM's count from a
    chat stream's running usage or a Messages stream's first event, else the estimate (an
    upper bound). A completions chunk counts only its own prompt's tokens, so several
    prompts keep the estimate."""
    counted = None
    if parsed.stream and parsed.kind == "chat":
        counted = meter.running_usage
    elif parsed.stream and parsed.kind == "messages":
        counted = meter.start_usage
    return parsed.prompt_estimate if counted is None else counted.prompt_tokens


def _record_outcome(
    record: RequestRecord,
    lease: Lease,
    parsed: CompletionRequest,
    meter: ResponseMeter,
    outcome: ProxyOutcome | None,
) -> None:
    """What the metrics need to know of a settled request."""
    if outcome is not None:
        record.note_exchange(outcome)
        problem = "in_band" if meter.inband_error else meter.problem
        record.upstream_error = upstream_error_kind(outcome.error, outcome.upstream_status, problem)
        complete = not outcome.client_disconnected and outcome.error is None
        answered = outcome.upstream_status is not None and outcome.upstream_status < 400
        if complete and answered and meter.usage is None and not meter.inband_error:
            record.upstream_error = record.upstream_error or "missing_usage"
    usage = meter.usage
    charged = lease.charged_tokens or 0
    if usage is not None:
        record.prompt_tokens = min(usage.prompt_tokens, charged)
    elif charged:  # vLLM's final usage never came
        record.prompt_tokens = min(_cut_prompt(parsed, meter), charged)
    record.completion_tokens = charged - record.prompt_tokens


def _account(
    engine: Engine, record: RequestRecord, parsed: CompletionRequest, *, cut: bool
) -> None:
    """What the engine's own counters should find covered (the accounting oracle): the
    charge, with the prompt once per sequence run on it (vLLM prefills each of `n` choices,
    where the charge counts the prompt once, as OpenAI's usage does)."""
    per_prompt = parsed.choices // parsed.prompts
    engine.accounted_tokens += record.completion_tokens + record.prompt_tokens * per_prompt
    if cut:  # charged by a bound: vLLM may have run on a moment past the last read
        engine.cut_sequences += parsed.choices


def _too_wide(parsed: CompletionRequest, per_key: int) -> InvalidRequestError:
    """vLLM runs every sequence of a request (n x prompts) at once: one wider than the slots
    a key may hold could never start, and the queue must not pretend it takes fewer."""
    param = "prompt" if parsed.kind == "completion" and parsed.data.get("n") in (None, 1) else "n"
    return InvalidRequestError(
        f"This request runs {parsed.choices} sequences (n x prompts); the engines run at most "
        f"{per_key} of one key at a time.",
        param=param,
    )


def _beyond_context(parsed: CompletionRequest, exc: BeyondContext) -> InvalidRequestError:
    """A client's max_tokens (after the key's cap) beyond the model's context can never be
    served: 400 before any quota, in OpenAI's words. (An implied max_tokens is fitted.)"""
    param = parsed.max_tokens_field
    return InvalidRequestError(
        f"{param} is too large: {exc.requested}. This model's maximum context "
        f"length is {exc.context_window} tokens.",
        param=param,
    )
