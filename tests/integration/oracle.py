"""The accounting oracle of the service tier: vLLM's own token counters.

The gateway is its engine's only client, so over any interval the tokens it charged must
cover the tokens the engine worked on: every generated token, and every prompt token it
computed (`vllm:prompt_tokens_by_source_total{source="local_compute"}`; a prompt served from
the prefix cache, e.g. the second choice of `n: 2`, is charged once but computed once too).
A request charged by a bound (no final usage: cut, aborted) may have generated a few more
tokens between the gateway's last read and vLLM's abort: each of its sequences (n x
prompts) is allowed `CUT_SLACK_TOKENS`.

`conftest.accounting_oracle` reads both sides before and after every test that uses a
stack of real engines behind gateways (a fixture named in `conftest.ORACLE_FIXTURES` whose
value has `oracle_urls()`: every gateway and engine, summed); a test that sends requests
straight to an engine (uncharged on purpose) says so with `@pytest.mark.engine_direct`, one
that kills or freezes what the oracle reads with `@pytest.mark.oracle_exempt`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from serving.gateway.usage import CUT_SLACK_TOKENS
from tests.integration.conftest import Samples, scrape, total

__all__ = ["CUT_SLACK_TOKENS", "Ledger", "read_ledger"]


@dataclass(frozen=True)
class Ledger:
    engine_tokens: float
    """Generated plus computed prompt tokens, by vLLM's counters."""
    charged: float
    """Tokens the gateway charged for requests on the engine."""
    cut: float
    """Sequences of the requests it charged by a bound."""

    def shortfall(self, earlier: Ledger) -> float:
        """How far the charges since `earlier` fall short of the engine's count, less the
        slack of the cut requests (positive: tokens the engine made that nobody paid)."""
        counted = self.engine_tokens - earlier.engine_tokens
        charged = self.charged - earlier.charged
        slack = (self.cut - earlier.cut) * CUT_SLACK_TOKENS
        return counted - charged - slack


def engine_tokens(samples: Samples) -> float:
    computed = total(samples, "vllm:prompt_tokens_by_source_total", source="local_compute")
    return total(samples, "vllm:generation_tokens_total") + computed


def read_ledger(
    gateway_url: str | Sequence[str],
    engine_url: str | Sequence[str],
    *,
    steady: bool = True,
    settle_s: float = 30,
) -> Ledger:
    """Both sides, summed over the gateways and the engines, once nothing runs and, when
    `steady`, vLLM's counters stopped moving (they are updated as the engine's outputs are
    processed, a moment after the last byte went out; an aborted request's last step comes
    later still)."""
    gateway_urls = [gateway_url] if isinstance(gateway_url, str) else list(gateway_url)
    engine_urls = [engine_url] if isinstance(engine_url, str) else list(engine_url)
    deadline = time.monotonic() + settle_s
    previous: Ledger | None = None
    while True:
        engines = [scrape(url) for url in engine_urls]
        gateways = [scrape(url) for url in gateway_urls]

        def both(samples: list[Samples], name: str) -> float:
            return sum(total(one, name) for one in samples)

        idle = (
            both(engines, "vllm:num_requests_running") == 0
            and both(engines, "vllm:num_requests_waiting") == 0
            and both(gateways, "gateway_in_flight_requests") == 0
            and both(gateways, "gateway_quota_leases") == 0
        )
        ledger = Ledger(
            sum(engine_tokens(one) for one in engines),
            both(gateways, "gateway_engine_accounted_tokens_total"),
            both(gateways, "gateway_engine_cut_sequences_total"),
        )
        if idle and (not steady or ledger == previous):
            return ledger
        if time.monotonic() > deadline:
            raise AssertionError(f"the stack did not settle within {settle_s} s: {ledger}")
        previous = ledger if idle else None
        time.sleep(0.1)
