"""The cross-check's verdict: medians of interleaved rounds, each side's spread, and why.

Per client and metric the rounds give a median and a spread: the range of the rounds that
decide the median over the median. With four rounds or more, those are the rounds left after
dropping the lowest and the highest: one round that the machine moved (a neighbour's burst
lands in one round of five) moves the full range but cannot move the median past the middle
rounds' range. With three, every round counts. The full min..max is shown beside it.
Output throughput and mean TTFT are judged on the medians: the clients agree when our median
is within the tolerance of vLLM's. A side whose own rounds spread wider than the tolerance
marks the metric noisy: the machine then moved one client's numbers more than the
tolerance between its own rounds, so whether the medians land inside the tolerance is
luck. The verdict is then INCONCLUSIVE whatever the medians say (they are still shown),
with the spread and the advice to rerun on a quieter machine: a verdict that flips from
run to run with the machine's load would tell the user nothing. Mean TPOT and each client's
CPU per request are shown, not judged.

Usage: `verdict = judge(rounds, tolerance=0.10)`; `print(verdict.table())`.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, field

TOLERANCE = 0.10
CLIENTS = ("ours", "vllm")
# metric label -> RoundResult field; the first two are judged, the rest shown.
METRICS = {
    "output tokens/s": "output_tokens_per_s",
    "mean TTFT (ms)": "mean_ttft_ms",
    "mean TPOT (ms)": "mean_tpot_ms",
    "client CPU ms/request": "cpu_ms_per_request",
    "engine's mean TTFT (ms)": "engine_ttft_ms",
}
JUDGED = ("output tokens/s", "mean TTFT (ms)")
# A judged latency also agrees within this many ms: at a few tens of ms, the clients' own work
# per request (parsing, their event loop) is a few ms apart. Measured on a quiet run with the
# tiny engine: TTFT 27.0 ms ours, 33.3 ms vLLM's client (ratio 0.81), the engine's own 21.9 and
# 23.9 ms under them, while throughput agreed within 0.1%.
FLOORS = {"mean TTFT (ms)": 10.0}
# From this many rounds a side, its lowest and highest are left out of its spread.
MIDDLE_FROM = 4


@dataclass(frozen=True)
class RoundResult:
    client: str  # "ours" or "vllm"
    index: int  # the client's own round number, from 1
    position: int  # place in the whole interleaved sequence, from 1
    completed: int
    failed: int
    duration_s: float
    output_tokens_per_s: float
    mean_ttft_ms: float
    mean_tpot_ms: float
    cpu_ms_per_request: float | None  # the client's process tree, in its request window
    host_cpu_percent: float | None  # the whole machine, same window
    prefix_cache_hits: float | None = None  # engine counter increase over the round
    engine_ttft_ms: float | None = None  # the engine's own mean over the round's requests
    engine_e2e_ms: float | None = None


@dataclass(frozen=True)
class Spread:
    median: float
    low: float
    high: float
    # The range of the rounds that decide the median (see the module docstring).
    mid_low: float
    mid_high: float

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        ordered = sorted(values)
        middle = ordered[1:-1] if len(ordered) >= MIDDLE_FROM else ordered
        return cls(statistics.median(values), ordered[0], ordered[-1], middle[0], middle[-1])

    @property
    def relative(self) -> float:
        """The middle rounds' range over the median: how far this side moved on its own."""
        return (self.mid_high - self.mid_low) / self.median if self.median else 0.0


@dataclass(frozen=True)
class Comparison:
    metric: str
    ours: Spread
    vllm: Spread
    tolerance: float = TOLERANCE
    judged: bool = True
    floor: float = 0.0  # an absolute difference of the medians that still agrees (FLOORS)

    @property
    def ratio(self) -> float:
        return self.ours.median / self.vllm.median if self.vllm.median else float("inf")

    @property
    def agree(self) -> bool:
        close = abs(self.ours.median - self.vllm.median) <= self.floor
        return abs(self.ratio - 1) <= self.tolerance or close

    @property
    def noisy(self) -> bool:
        return max(self.ours.relative, self.vllm.relative) > self.tolerance


@dataclass(frozen=True)
class Verdict:
    comparisons: list[Comparison]
    rounds: list[RoundResult]
    tolerance: float
    reasons: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def judged(self) -> list[Comparison]:
        return [c for c in self.comparisons if c.judged]

    @property
    def agree(self) -> bool:
        return all(c.agree for c in self.judged)

    @property
    def noisy(self) -> bool:
        return any(c.noisy for c in self.judged)

    @property
    def label(self) -> str:
        if self.noisy:
            return "INCONCLUSIVE (the machine is too noisy for this tolerance)"
        return "AGREE" if self.agree else "DIFFER"

    def table(self) -> str:
        per_client = {c: sum(1 for r in self.rounds if r.client == c) for c in CLIENTS}
        order = ", ".join(r.client for r in sorted(self.rounds, key=lambda r: r.position))
        lines = [
            f"{per_client['ours']} rounds of ours, {per_client['vllm']} of vllm bench, "
            f"interleaved: {order}",
            f"{'metric':<24}{'ours: median (min..max, spread)':>36}"
            f"{'vllm bench: median (min..max, spread)':>42}{'ratio':>8}  result",
        ]
        for c in self.comparisons:
            if c.judged:
                within = f">{c.tolerance:.0%}" + (f" and >{c.floor:g}" if c.floor else "")
                result = "ok" if c.agree else f"DIFFERS ({within})"
                if c.noisy:
                    result += ", noisy"
            else:
                result = "shown"
            lines.append(
                f"{c.metric:<24}{_spread(c.ours):>36}{_spread(c.vllm):>42}{c.ratio:>8.3f}  {result}"
            )
        lines.append(f"verdict: {self.label} (medians, tolerance {self.tolerance:.0%})")
        if any(len(_values(self.rounds, c, "mean_ttft_ms")) >= MIDDLE_FROM for c in CLIENTS):
            lines.append(
                "spread: the middle rounds' range over the median (lowest, highest left out)"
            )
        lines += [f"why: {reason}" for reason in self.reasons]
        lines += [f"note: {note}" for note in self.notes]
        return "\n".join(lines)

    def rounds_table(self) -> str:
        lines = [
            f"{'#':>3} {'client':<6}{'tok/s':>9}{'TTFT ms':>9}{'TPOT ms':>9}"
            f"{'CPU ms/req':>11}{'host CPU':>9}{'engine TTFT':>12}{'ok':>5}{'failed':>7}"
        ]
        for r in sorted(self.rounds, key=lambda r: r.position):
            cpu = "-" if r.cpu_ms_per_request is None else f"{r.cpu_ms_per_request:.2f}"
            host = "-" if r.host_cpu_percent is None else f"{r.host_cpu_percent:.0f}%"
            engine = "-" if r.engine_ttft_ms is None else f"{r.engine_ttft_ms:.1f}"
            lines.append(
                f"{r.position:>3} {r.client:<6}{r.output_tokens_per_s:>9.1f}"
                f"{r.mean_ttft_ms:>9.1f}{r.mean_tpot_ms:>9.2f}{cpu:>11}{host:>9}"
                f"{engine:>12}{r.completed:>5}{r.failed:>7}"
            )
        return "\n".join(lines)


def _spread(s: Spread) -> str:
    return f"{s.median:,.2f} ({s.low:,.2f}..{s.high:,.2f}, {s.relative:.0%})"


def _values(rounds: list[RoundResult], client: str, attribute: str) -> list[float]:
    found = [getattr(r, attribute) for r in rounds if r.client == client]
    return [float(v) for v in found if v is not None]


def judge(rounds: list[RoundResult], *, tolerance: float = TOLERANCE) -> Verdict:
    comparisons: list[Comparison] = []
    for metric, attribute in METRICS.items():
        ours, vllm = _values(rounds, "ours", attribute), _values(rounds, "vllm", attribute)
        if ours and vllm:
            comparisons.append(
                Comparison(
                    metric,
                    Spread.of(ours),
                    Spread.of(vllm),
                    tolerance,
                    metric in JUDGED,
                    FLOORS.get(metric, 0.0),
                )
            )
    verdict = Verdict(comparisons, rounds, tolerance)
    reasons = [] if verdict.agree and not verdict.noisy else reasons_for(verdict)
    return Verdict(comparisons, rounds, tolerance, reasons, notes_for(verdict))


def reasons_for(verdict: Verdict) -> list[str]:
    """Why the medians differ: what we can detect, else the gap itself. Never empty."""
    found: list[str] = []
    for c in verdict.judged:
        if c.noisy:
            side, spread = max(
                (("ours", c.ours.relative), ("vllm bench", c.vllm.relative)), key=lambda s: s[1]
            )
            found.append(
                f"{c.metric}: {side}'s own rounds spread {spread:.0%}, wider than the "
                f"{c.tolerance:.0%} tolerance: the machine, not the harness, moves this number "
                f"(medians {'within' if c.agree else 'outside'} the tolerance by chance); "
                "rerun on a quieter machine"
            )
    failed = {c: sum(r.failed for r in verdict.rounds if r.client == c) for c in CLIENTS}
    if any(failed.values()):
        found.append(f"failed requests: ours {failed['ours']}, vllm bench {failed['vllm']}")
    hits = sum(r.prefix_cache_hits or 0 for r in verdict.rounds)
    if hits:
        found.append(f"{hits:.0f} prefix cache hits during the rounds: some prompts were cached")
    if not found and not verdict.agree:
        gaps = ", ".join(
            f"{c.metric} ours {c.ours.median:,.2f} vs {c.vllm.median:,.2f}"
            for c in verdict.judged
            if not c.agree
        )
        found.append(
            f"no known cause detected ({gaps}) while both sides' rounds agree with themselves: "
            "the two clients measure something differently"
        )
    return found


def notes_for(verdict: Verdict) -> list[str]:
    """What the reader should know even when the clients agree: noise, client CPU."""
    notes: list[str] = []
    cpu = next((c for c in verdict.comparisons if c.metric == "client CPU ms/request"), None)
    throughput = next((c for c in verdict.comparisons if c.metric == "output tokens/s"), None)
    if cpu is not None and cpu.ours.median > cpu.vllm.median:
        rate = statistics.median(
            r.completed / r.duration_s for r in verdict.rounds if r.duration_s > 0
        )
        extra = (cpu.ours.median - cpu.vllm.median) / 1000 * rate
        cores = os.cpu_count() or 1
        notes.append(
            f"our client used {cpu.ours.median - cpu.vllm.median:.2f} ms more CPU per request "
            f"than vLLM's ({cpu.ratio:.2f}x): at {rate:.1f} requests/s that is {extra:.1%} of "
            f"one core, {extra / cores:.1%} of this machine's {cores}, taken from the engine "
            "when they share cores"
            + (f" (throughput ratio {throughput.ratio:.3f})" if throughput else "")
        )
    return notes
