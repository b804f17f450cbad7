"""The accounting oracle of the service tier: vLLM's own token counters.

The gateways are their engines' only clients, so over any interval the tokens they charged
must cover the tokens the engines worked on: every generated token, and every prompt token
computed (`vllm:prompt_tokens_by_source_total{source="local_compute"}`; a prompt served from
the prefix cache, e.g. the second choice of `n: 2`, is charged once but computed once too).
A request charged by a bound (no final usage: cut, aborted) may have generated a few more
tokens between the gateway's last read and vLLM's abort: each of its sequences (n x
prompts) is allowed `CUT_SLACK_TOKENS`.

`conftest.accounting_oracle` reads both sides before and after every test that uses a
stack of real engines behind gateways (a fixture named in `conftest.ORACLE_FIXTURES` whose
value has `oracle_urls()`: every gateway and engine, summed). A gateway a test starts in
front of such an engine is counted too while it runs inside `front(url, engine)`, and its
last count when it stops. Requests sent straight to an engine (uncharged on purpose) go
inside `off_the_books`: what the engine counts there is left out, and no gateway may charge
anything meanwhile. A test that kills or freezes what the oracle reads says so with
`@pytest.mark.oracle_exempt`.

    with front(gateway_url, stack.engine_url):   # a gateway of the test's own
        ...
    with stack.off_the_books():                  # oracle.off_the_books(*stack.oracle_urls())
        stack.direct_client().chat.completions.create(...)
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from serving.gateway.usage import CUT_SLACK_TOKENS
from tests.integration.conftest import Samples, scrape, total

__all__ = [
    "CUT_SLACK_TOKENS",
    "Ledger",
    "forget_stopped",
    "front",
    "fronts_of",
    "off_the_books",
    "read_ledger",
    "stopped_fronts",
    "uncharged",
]

Charges = tuple[float, float]
"""One gateway's tokens charged for requests on its engines, and sequences charged by a bound."""


@dataclass(frozen=True)
class Ledger:
    engine_tokens: float
    """Generated plus computed prompt tokens, by vLLM's counters."""
    gateways: Mapping[str, Charges] = field(default_factory=dict)
    """Each gateway's charges, by its URL."""

    @property
    def charged(self) -> float:
        return sum(charged for charged, _ in self.gateways.values())

    @property
    def cut(self) -> float:
        return sum(cut for _, cut in self.gateways.values())

    def shortfall(self, earlier: Ledger) -> float:
        """How far the charges since `earlier` fall short of the engines' count, less the
        slack of the cut requests (positive: tokens the engines made that nobody paid). A
        gateway `earlier` did not read started since, from nothing."""
        counted = self.engine_tokens - earlier.engine_tokens
        charged = cut = 0.0
        for url, (now_charged, now_cut) in self.gateways.items():
            then_charged, then_cut = earlier.gateways.get(url, (0.0, 0.0))
            charged += now_charged - then_charged
            cut += now_cut - then_cut
        return counted - charged - cut * CUT_SLACK_TOKENS

    def with_gateways(self, stopped: Mapping[str, Charges]) -> Ledger:
        """This ledger with the last charges of gateways that stopped since it was read."""
        return Ledger(self.engine_tokens, {**stopped, **self.gateways})


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
    """Both sides, over the gateways and the engines, once nothing runs and, when `steady`,
    vLLM's counters stopped moving (they are updated as the engine's outputs are processed,
    a moment after the last byte went out; an aborted request's last step comes later
    still)."""
    gateway_urls = [gateway_url] if isinstance(gateway_url, str) else list(gateway_url)
    engine_urls = [engine_url] if isinstance(engine_url, str) else list(engine_url)
    deadline = time.monotonic() + settle_s
    previous: Ledger | None = None
    while True:
        engines = [scrape(url) for url in engine_urls]
        gateways = {url: scrape(url) for url in gateway_urls}

        def both(samples: Sequence[Samples], name: str) -> float:
            return sum(total(one, name) for one in samples)

        fronts = list(gateways.values())
        idle = (
            both(engines, "vllm:num_requests_running") == 0
            and both(engines, "vllm:num_requests_waiting") == 0
            and both(fronts, "gateway_in_flight_requests") == 0
            and both(fronts, "gateway_quota_leases") == 0
        )
        ledger = Ledger(
            sum(engine_tokens(one) for one in engines),
            {
                url: (
                    total(samples, "gateway_engine_accounted_tokens_total"),
                    total(samples, "gateway_engine_cut_sequences_total"),
                )
                for url, samples in gateways.items()
            },
        )
        if idle and (not steady or ledger == previous):
            return ledger
        if time.monotonic() > deadline:
            raise AssertionError(f"the stack did not settle within {settle_s} s: {ledger}")
        previous = ledger if idle else None
        time.sleep(0.1)


# Gateways of a test's own in front of an oracle-checked engine: URL -> engine URL while
# they run; URL -> (engine URL, last charges) once stopped, until the oracle takes them.
_fronts: dict[str, str] = {}
_stopped: dict[str, tuple[str, Charges]] = {}
# Tokens engines counted for requests sent around the gateways on purpose, by engine URL,
# until the oracle takes them.
_uncharged: dict[str, float] = {}


@contextmanager
def front(gateway_url: str, engine_url: str) -> Iterator[None]:
    """Count `gateway_url`'s charges against `engine_url` while it runs; on the way out
    (before the gateway stops) its last charges, once it and the engine are idle."""
    _fronts[gateway_url] = engine_url
    try:
        yield
    finally:
        del _fronts[gateway_url]
    # Not after a failure inside: the stack may never settle, and the oracle does not judge a
    # failed test (`conftest.accounting_oracle`).
    last = read_ledger(gateway_url, engine_url)
    _stopped[gateway_url] = (engine_url, last.gateways[gateway_url])


def fronts_of(engine_urls: Sequence[str]) -> list[str]:
    """The running fronts of these engines."""
    return [url for url, engine in _fronts.items() if engine in engine_urls]


def stopped_fronts(engine_urls: Sequence[str]) -> dict[str, Charges]:
    """The last charges of the fronts of these engines that stopped since the last call."""
    taken = {url: charges for url, (engine, charges) in _stopped.items() if engine in engine_urls}
    for url in taken:
        del _stopped[url]
    return taken


def forget_stopped() -> None:
    """Drop what a test the oracle does not check left: stopped fronts, uncharged tokens."""
    _stopped.clear()
    _uncharged.clear()


@contextmanager
def off_the_books(gateway_urls: Sequence[str], engine_urls: Sequence[str]) -> Iterator[None]:
    """Requests sent straight to these engines inside: what the engines count meanwhile is
    left out of the oracle, and the gateways (their fronts too) must charge nothing in it,
    so no gateway request hides there. Both sides are read idle and settled on the way in
    and out."""
    gateways = [*gateway_urls, *fronts_of(engine_urls)]
    before = read_ledger(gateways, engine_urls)
    yield
    after = read_ledger(gateways, engine_urls)
    assert after.gateways == before.gateways, (
        f"a gateway charged requests among the ones sent around it: {before} -> {after}"
    )
    key = " ".join(sorted(engine_urls))
    _uncharged[key] = _uncharged.get(key, 0.0) + after.engine_tokens - before.engine_tokens


def uncharged(engine_urls: Sequence[str]) -> float:
    """The tokens these engines counted `off_the_books` since the last call."""
    return _uncharged.pop(" ".join(sorted(engine_urls)), 0.0)
