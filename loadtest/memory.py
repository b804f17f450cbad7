"""The load test that proves the memory plan: ramp sequences of a known size past what fits.

The planner says how many KV blocks the profile's engine has and how many blocks a sequence
of N tokens holds (`serving.planner.kv.sequence_fit`: its own functions, no second copy of
the math). From that this module sizes a workload in which every sequence holds exactly K
blocks from the moment vLLM admits it: K = the profile's max_model_len // block_size
(long context), a prompt that reaches `MARGIN` tokens into its K-th block, and an output
(`ignore_eos`, of varied length so that requests do not end in lock-step) that stays
inside that block. A profile with large blocks (cpu-tiny-smallkv: 512 tokens) makes that
output long, so that decoding, not prefill, fills most of a sequence's life. vLLM admits a
waiting request while the free blocks hold its prompt, and a sequence that never needs
another block is never preempted, so the plan predicts exactly: S = usable blocks // K
sequences run at once (or max_num_seqs, whichever binds), the (S+1)-th waits, and the
cache is then S x K / usable blocks full.

The ramp then holds 1, 2, ... closed-loop Locust users (past S + 1) and moves on by
conditions seen in the engine's /metrics, never by a clock: a step starts measuring once a
scrape shows all its users' requests in the engine (running + waiting >= users), and ends
once vLLM has finished twice as many requests as there are users since then (every
in-flight sequence turned over about twice) and at least `min_scrapes` scrapes were taken.
Each step reports medians of what its scrapes saw (KV usage, running, waiting, KV blocks per
running sequence), the preemptions and the output tokens/s: medians over several request
lifetimes, so a stalled process or a scrape landing between one request ending and the
next starting cannot decide a result.

What the gauges can and cannot say: vLLM sets running, waiting and KV usage once per
engine step, after the step. On a CPU a step that prefills a newly admitted prompt lasts
far longer than a decode step, so for much of the wall time the gauges show the state
*before* an admission (one sequence fewer, one waiting), and a closed-loop user spends a
while between requests on a busy 2-core machine (the engine's threads starve the API server
and Locust). Medians of KV usage therefore sit up to a sequence below the plan even when
requests wait (measured: 66.7% against 88.9% at 5 users in one run, 88.9% in another). So
the plateau is the highest reading while requests wait, which holds through every decode
step of a full cache (a third or more of a saturated step's scrapes see it), and a second
check holds that no reading of the whole ramp exceeds it; the blocks per running sequence
(usage x usable blocks / running) are exact in every scrape.

Verdict: requests start waiting (or being preempted) within `tolerance_sequences` of the
plan's S + 1, and the KV usage of the saturated steps is within `tolerance_usage`
(relative) of the plan's plateau.

Usage: `python -m loadtest memory --profile cpu-tiny-smallkv --host ... --engine-metrics ...`.
"""

from __future__ import annotations

import re
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from loadtest import scraper as m
from loadtest.analysis import analyze
from loadtest.config import write_users
from loadtest.errors import LoadTestError
from loadtest.memory_plan import (
    TOLERANCE_SEQUENCES,
    TOLERANCE_USAGE,
    Prediction,
)
from loadtest.records import RequestRecord
from loadtest.report import write_report
from loadtest.runner import LocustRun, run_locust
from loadtest.scraper import MetricsScraper, Scrape, fetch
from loadtest.targets import Check, Targets, Verdict


@dataclass(frozen=True)
class Window:
    users: int
    start: float  # wall clock of the scrape that showed the step's users in the engine
    end: float


@dataclass
class Ramp:
    """Drives a Locust run (loadtest.runner.Driver) through `levels` users."""

    levels: list[int]
    users_file: Path
    min_scrapes: int = 20
    turnovers: int = 2  # a step ends once vLLM finished turnovers x users requests
    step_timeout_s: float = 300.0
    windows: list[Window] = field(default_factory=list)
    log: Callable[[str], None] = print

    def __call__(self, scraper: MetricsScraper, process: subprocess.Popen[bytes]) -> None:
        try:
            for users in self.levels:
                write_users(self.users_file, users)
                self.windows.append(self._step(users, scraper, process))
                w = self.windows[-1]
                self.log(f"users={users}: measured {w.end - w.start:.1f}s")
        finally:
            write_users(self.users_file, None)

    def _step(
        self, users: int, scraper: MetricsScraper, process: subprocess.Popen[bytes]
    ) -> Window:
        asked = time.time()

        def in_engine(s: Scrape) -> bool:
            v = s.values
            return v.get(m.RUNNING, 0.0) + v.get(m.WAITING, 0.0) >= users

        first = self._wait(users, scraper, process, after=asked, until=in_engine)
        done0 = first.values.get(m.REQUEST_SUCCESS, 0.0)
        seen = 0

        def turned_over(s: Scrape) -> bool:
            nonlocal seen
            seen += 1
            finished = s.values.get(m.REQUEST_SUCCESS, 0.0) - done0
            return seen >= self.min_scrapes and finished >= self.turnovers * users

        last = self._wait(users, scraper, process, after=first.t, until=turned_over)
        return Window(users, first.t, last.t)

    def _wait(
        self,
        users: int,
        scraper: MetricsScraper,
        process: subprocess.Popen[bytes],
        *,
        after: float,
        until: Callable[[Scrape], bool],
    ) -> Scrape:
        """The first engine scrape after `after` for which `until` holds (each looked at once)."""
        deadline = time.monotonic() + self.step_timeout_s
        index = 0
        while True:
            samples = scraper.samples
            while index < len(samples):
                sample = samples[index]
                index += 1
                if sample.source == "engine" and sample.t > after and until(sample):
                    return sample
            if process.poll() is not None:
                raise LoadTestError(f"Locust exited ({process.returncode}) during {users} users")
            if time.monotonic() > deadline:
                raise LoadTestError(
                    f"{users} users: the engine did not reach the step's condition within "
                    f"{self.step_timeout_s:.0f}s (see the engine's /metrics)"
                )
            time.sleep(0.1)


# ---------------------------------------------------------------------------------------
# Analysis: per step, then the verdict.


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


@dataclass(frozen=True)
class Step:
    users: int
    seconds: float
    scrapes: int
    kv_usage: float | None  # median over the step's scrapes, 0..1
    kv_usage_max: float | None
    running: float | None  # median
    waiting: float | None  # median
    waiting_max: float | None
    waiting_share: float  # of the step's scrapes that saw a request waiting
    # KV blocks per running sequence (usage x usable blocks / running), median over the
    # scrapes with one running: exact whether or not all users' requests were in the engine
    blocks_per_sequence: float | None
    preemptions: float
    engine_tokens_per_s: float | None  # vllm:generation_tokens_total over the window
    client_tokens_per_s: float  # output tokens of the requests that ended in the window
    requests: int  # requests that ended in the window (ok or not)
    failed: int
    predicted_running: int
    predicted_waiting: int
    predicted_usage: float
    predicted_blocks_per_sequence: int

    @property
    def waits(self) -> bool:
        """Requests waited for most of the step (the median scrape saw one)."""
        return (self.waiting or 0.0) >= 1

    @property
    def preempts(self) -> bool:
        return self.preemptions > 0


def analyze_step(
    window: Window,
    scrapes: Sequence[Scrape],
    records: Sequence[RequestRecord],
    prediction: Prediction,
) -> Step:
    inside = [s for s in scrapes if s.source == "engine" and window.start <= s.t <= window.end]

    def values(name: str) -> list[float]:
        return [s.values[name] for s in inside if name in s.values]

    def increase(name: str) -> float | None:
        points = values(name)
        return points[-1] - points[0] if len(points) >= 2 else None

    seconds = window.end - window.start
    generated = increase(m.GENERATION_TOKENS)
    ended = [r for r in records if window.start <= r.end <= window.end]
    kv, waiting = values(m.KV_USAGE), values(m.WAITING)
    usable = prediction.fit.usable_blocks
    per_sequence = [
        s.values[m.KV_USAGE] * usable / s.values[m.RUNNING]
        for s in inside
        if s.values.get(m.RUNNING, 0.0) >= 1 and m.KV_USAGE in s.values
    ]
    return Step(
        users=window.users,
        seconds=seconds,
        scrapes=len(inside),
        kv_usage=_median(kv),
        kv_usage_max=max(kv, default=None),
        running=_median(values(m.RUNNING)),
        waiting=_median(waiting),
        waiting_max=max(waiting, default=None),
        waiting_share=sum(1 for w in waiting if w >= 1) / len(waiting) if waiting else 0.0,
        blocks_per_sequence=_median(per_sequence),
        preemptions=increase(m.PREEMPTIONS) or 0.0,
        engine_tokens_per_s=generated / seconds if generated is not None and seconds else None,
        client_tokens_per_s=sum(r.output_tokens for r in ended if r.ok) / seconds
        if seconds
        else 0.0,
        requests=len(ended),
        failed=sum(1 for r in ended if not r.ok),
        predicted_running=prediction.running_at(window.users),
        predicted_waiting=max(0, window.users - prediction.sequences),
        predicted_usage=prediction.usage_at(window.users),
        predicted_blocks_per_sequence=prediction.fit.blocks_per_sequence,
    )


@dataclass(frozen=True)
class Measured:
    waiting_from: int | None  # lowest users at which requests waited
    preempting_from: int | None  # lowest users at which vLLM preempted
    saturated_from: int | None  # the lower of the two
    sequences: float | None  # the most sequences running at once (median of a step)
    # The KV usage the cache tops out at while requests wait: the highest reading of the
    # saturated steps (held through every decode step there, so not a lucky scrape).
    plateau_usage: float | None
    plateau_median: float | None  # median of the saturated steps' readings (see module doc)
    usage_max: float | None  # the highest reading of the whole ramp
    failed: int


def measure(
    steps: Sequence[Step], scrapes: Sequence[Scrape], windows: Sequence[Window]
) -> Measured:
    waiting = next((s.users for s in steps if s.waits), None)
    preempting = next((s.users for s in steps if s.preempts), None)
    found = [u for u in (waiting, preempting) if u is not None]
    saturated = min(found) if found else None
    plateau: float | None = None
    median: float | None = None
    if saturated is not None:
        pooled = [
            s.values[m.KV_USAGE]
            for w in windows
            if w.users >= saturated
            for s in scrapes
            if s.source == "engine" and w.start <= s.t <= w.end and m.KV_USAGE in s.values
        ]
        plateau, median = max(pooled, default=None), _median(pooled)
    running = [s.running for s in steps if s.running is not None]
    highest = [s.kv_usage_max for s in steps if s.kv_usage_max is not None]
    return Measured(
        waiting_from=waiting,
        preempting_from=preempting,
        saturated_from=saturated,
        sequences=max(running, default=None),
        plateau_usage=plateau,
        plateau_median=median,
        usage_max=max(highest, default=None),
        failed=sum(s.failed for s in steps),
    )


def verdict(
    prediction: Prediction,
    measured: Measured,
    *,
    tolerance_sequences: int = TOLERANCE_SEQUENCES,
    tolerance_usage: float = TOLERANCE_USAGE,
    top_level: int,
) -> Verdict:
    want = prediction.waiting_from
    got = measured.saturated_from
    where = (
        f"{got} users"
        + (f" (waiting from {measured.waiting_from})" if measured.waiting_from else "")
        + (f" (preempted from {measured.preempting_from})" if measured.preempting_from else "")
        if got is not None
        else f"none up to {top_level} users"
    )
    plateau, expected = measured.plateau_usage, prediction.plateau_usage
    top = measured.usage_max
    return Verdict(
        [
            Check(
                "requests start waiting or being preempted at",
                f"{want} ± {tolerance_sequences} users",
                where,
                got is not None and abs(got - want) <= tolerance_sequences,
            ),
            Check(
                "KV cache usage at the plateau (highest while requests wait)",
                f"{expected * 100:.1f}% ± {tolerance_usage * 100:g}% of it",
                "no saturated step" if plateau is None else f"{plateau * 100:.1f}%",
                plateau is not None and abs(plateau - expected) <= tolerance_usage * expected,
            ),
            Check(
                "KV cache usage, highest of the ramp",
                f"<= {expected * 100:.1f}% + {tolerance_usage * 100:g}% of it",
                "no data" if top is None else f"{top * 100:.1f}%",
                top is not None and top <= expected * (1 + tolerance_usage),
            ),
            Check("failed requests", "0", str(measured.failed), measured.failed == 0),
        ]
    )


# ---------------------------------------------------------------------------------------
# What vLLM allocated, read once from its /metrics (vllm:cache_config_info).

CACHE_INFO = re.compile(r"^vllm:cache_config_info\{([^}]*)\}", re.MULTILINE)
LABEL = re.compile(r'(\w+)="([^"]*)"')


def engine_blocks(metrics_text: str) -> int | None:
    """vLLM's num_gpu_blocks from its /metrics, None when it does not say."""
    match = CACHE_INFO.search(metrics_text)
    if not match:
        return None
    labels = dict(LABEL.findall(match.group(1)))
    try:
        return int(labels["num_gpu_blocks"])
    except (KeyError, ValueError):
        return None


def template_run(
    base: LocustRun, levels: list[int], users_file: Path, step_timeout_s: float
) -> LocustRun:
    """The Locust run the ramp drives: its users from `users_file`, time for every step."""
    return replace(
        base,
        users=levels[0],
        users_file=users_file,
        duration_s=len(levels) * step_timeout_s + 60,
    )


# ---------------------------------------------------------------------------------------
# The whole mode: plan, ramp, measure, verdict.


@dataclass(frozen=True)
class MemoryResult:
    prediction: Prediction
    engine_blocks: int | None  # what vLLM allocated (vllm:cache_config_info)
    levels: list[int]
    steps: list[Step]
    measured: Measured
    verdict: Verdict
    meta: dict[str, Any]
    # "name" -> (seconds since the run started, value), for the timeline chart
    timeline: dict[str, list[tuple[float, float]]]
    windows: list[tuple[int, float, float]]  # (users, start, end) in seconds since the start
    warnings: list[str]


def run_memory(
    prediction: Prediction,
    template: LocustRun,
    *,
    levels: list[int],
    meta: dict[str, Any],
    engine_metrics: str,
    min_scrapes: int = 20,
    turnovers: int = 2,
    step_timeout_s: float = 300.0,
    tolerance_sequences: int = TOLERANCE_SEQUENCES,
    tolerance_usage: float = TOLERANCE_USAGE,
) -> MemoryResult:
    warnings: list[str] = []
    headers = {"Authorization": f"Bearer {template.api_key}"} if template.api_key else {}
    try:
        blocks = engine_blocks(fetch(engine_metrics, headers, timeout_s=10))
    except OSError as exc:
        raise LoadTestError(f"{engine_metrics}: {exc}") from exc
    if blocks is not None and blocks != prediction.num_blocks:
        warnings.append(
            f"vLLM allocated {blocks} KV blocks, the plan {prediction.num_blocks}: the engine "
            f"does not run profile {prediction.profile} as planned"
        )
    users_file = template.out / "users"
    ramp = Ramp(
        levels,
        users_file,
        min_scrapes=min_scrapes,
        turnovers=turnovers,
        step_timeout_s=step_timeout_s,
    )
    data = run_locust(template_run(template, levels, users_file, step_timeout_s), ramp)
    steps = [analyze_step(w, data.scrapes, data.records, prediction) for w in ramp.windows]
    measured = measure(steps, data.scrapes, ramp.windows)
    odd = sorted(
        {r.prompt_tokens for r in data.records if r.ok}
        - {n for n in range(prediction.sizing.tokens) if prediction.sizing.holds_its_blocks(n)}
    )
    if odd:
        warnings.append(
            f"the engine counted prompts of {odd} tokens, which do not hold exactly "
            f"{prediction.sizing.blocks} blocks: the sizing's tokenizer differs from the engine's"
        )
    checks = verdict(
        prediction,
        measured,
        tolerance_sequences=tolerance_sequences,
        tolerance_usage=tolerance_usage,
        top_level=max(levels),
    )
    run_report = analyze(data, Targets(), meta=meta)
    write_report(run_report, template.out / "run")
    warnings += run_report.warnings
    t0 = data.started
    timeline = {
        name: [(s.t - t0, s.values[name]) for s in data.scrapes if s.source == "engine"
               and name in s.values]
        for name in (m.KV_USAGE, m.RUNNING, m.WAITING)
    }  # fmt: skip
    return MemoryResult(
        prediction=prediction,
        engine_blocks=blocks,
        levels=levels,
        steps=steps,
        measured=measured,
        verdict=checks,
        meta=meta,
        timeline=timeline,
        windows=[(w.users, w.start - t0, w.end - t0) for w in ramp.windows],
        warnings=warnings,
    )
