"""The load generator: one aiohttp session per measurement, every response checked.

    target = Target(base_url="http://127.0.0.1:8102", api_key="sk-...", model="bench-model")
    latency = await measure(target, seconds=5, concurrency=1)       # one at a time, JSON
    streams = await measure(target, seconds=5, concurrency=32, stream=True)

`concurrency` workers send back to back. Once every worker has finished a request (and at
least `warm_s` passed, so connections are open and the servers warm; for a path so slow
that this takes longer than the window itself, after that long), a window of `seconds`
opens; only requests that complete inside it count, while the load goes on unchanged, so
slow paths are not penalised by ramp-up or drain. After the window no new request starts
and those in flight finish (drained, not cancelled). At most `MAX_REQUESTS` per measurement.

A response counts only when it is what the path must return: status 200 and a chat
completion (JSON), or an SSE stream carrying events and ending with `data: [DONE]`;
anything else is an error. CPU time of the given processes is read from /proc for the
window, to tell which side saturated its core.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import aiohttp

MAX_REQUESTS = 200_000
REQUEST_TIMEOUT_S = 30.0
WARM_S = 0.5  # a full run's; the smoke runs of the tests wait less
DONE = b"data: [DONE]"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
LOADGEN = "loadgen"
MACHINE = "machine"


@dataclass(frozen=True, kw_only=True)
class Target:
    """Where a path is reached and what it is sent."""

    base_url: str
    api_key: str
    model: str
    max_tokens: int = 20
    extra: Mapping[str, object] = field(default_factory=dict)
    """More request fields, e.g. ``{"ignore_eos": True}`` for vLLM."""

    def body(self, *, stream: bool) -> bytes:
        request: dict[str, object] = {
            "model": self.model,
            "messages": [{"role": "user", "content": "Say twenty words."}],
            "max_tokens": self.max_tokens,
            **self.extra,
        }
        if stream:
            request["stream"] = True
            request["stream_options"] = {"include_usage": True}
        return json.dumps(request, separators=(",", ":")).encode()

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}", "Content-Type": "application/json"}

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + "/v1/chat/completions"


@dataclass(frozen=True, kw_only=True)
class Sample:
    """One measurement of one path."""

    seconds: float
    ok: int
    errors: int
    chunks: int = 0
    """SSE data events received, `[DONE]` not counted (streams only)."""
    latencies_ms: Sequence[float] = ()
    cpu_share: Mapping[str, float] = field(default_factory=dict)
    """Busy share of one core per process group (1.0 = a full core), plus the load
    generator's own and `machine`: all cores together (up to the number of cores)."""
    first_error: str = ""
    answered: int = 0
    """Requests answered in the whole measurement, warm-up and drain included (`ok` counts
    the window's alone): what counters read around the measurement are divided by."""
    commands: Mapping[str, int] = field(default_factory=dict)
    """Commands the path's Redis processed during the whole measurement: `total` and per
    command (`redis_server.delta`); empty on paths without one."""

    @property
    def per_second(self) -> float:
        return self.ok / self.seconds if self.seconds > 0 else 0.0

    @property
    def chunks_per_second(self) -> float:
        return self.chunks / self.seconds if self.seconds > 0 else 0.0

    def percentile_ms(self, q: float) -> float:
        """Nearest-rank percentile of the latencies (NaN when there are none)."""
        if not self.latencies_ms:
            return float("nan")
        ordered = sorted(self.latencies_ms)
        rank = max(1, round(q / 100 * len(ordered)))
        return ordered[min(len(ordered), rank) - 1]


def cpu_seconds(pids: Sequence[int]) -> float:
    """User + system CPU of the processes `pids` so far (0 for any that is gone)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime: fields 14, 15 of stat
    return total / CLOCK_TICKS


def machine_busy_seconds() -> float:
    """CPU time all cores spent busy so far (user, nice, system, irq, softirq, steal)."""
    with open("/proc/stat", "rb") as stat:
        fields = stat.readline().split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    return (user + nice + system + irq + softirq + steal) / CLOCK_TICKS


def _cpu_now(groups: Mapping[str, Sequence[int]]) -> dict[str, float]:
    now = {name: cpu_seconds(pids) for name, pids in groups.items()}
    now[LOADGEN] = time.process_time()
    now[MACHINE] = machine_busy_seconds()
    return now


class _Run:
    """The workers' shared state during one measurement."""

    def __init__(self, target: Target, *, stream: bool) -> None:
        self.url = target.url
        self.body = target.body(stream=stream)
        self.headers = target.headers()
        self.stream = stream
        self.window_start: float | None = None
        self.window_end: float | None = None
        self.stopping = False
        self.completed = 0
        self.ok = 0
        self.errors = 0
        self.chunks = 0
        self.first_error = ""
        self.latencies_ms: list[float] = []

    def fail(self, reason: str) -> None:
        self.errors += 1
        if not self.first_error:
            self.first_error = reason[:300]

    async def one(self, session: aiohttp.ClientSession) -> None:
        start = time.perf_counter()
        try:
            async with session.post(self.url, data=self.body, headers=self.headers) as response:
                body = await response.read()
                status = response.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            self.fail(f"{type(exc).__name__}: {exc}")
            return
        end = time.perf_counter()
        if status != 200:
            self.fail(f"HTTP {status}: {body[:200]!r}")
            return
        events = 0
        if self.stream:
            events = body.count(b"data: ") - 1
            if events < 1 or not body.rstrip().endswith(DONE):
                self.fail(f"bad stream: ...{body[-200:]!r}")
                return
        elif b'"choices"' not in body:
            self.fail(f"bad completion: {body[:200]!r}")
            return
        self.completed += 1
        opened = self.window_start
        if (
            opened is None
            or end < opened
            or (self.window_end is not None and end > self.window_end)
        ):
            return
        self.ok += 1
        self.chunks += events
        if start >= opened:
            self.latencies_ms.append((end - start) * 1000)

    async def worker(self, session: aiohttp.ClientSession) -> None:
        while not self.stopping and self.completed + self.errors < MAX_REQUESTS:
            await self.one(session)


async def measure(
    target: Target,
    *,
    seconds: float,
    concurrency: int,
    stream: bool = False,
    cpu_groups: Mapping[str, Sequence[int]] | None = None,
    warm_s: float = WARM_S,
) -> Sample:
    """Completed requests (or streams) and their latencies in a window of `seconds`."""
    groups = cpu_groups or {}
    run = _Run(target, stream=stream)
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, auto_decompress=False
    ) as session:
        workers = [asyncio.ensure_future(run.worker(session)) for _ in range(concurrency)]
        try:
            started = time.perf_counter()
            while True:
                waited = time.perf_counter() - started
                warmed = run.completed + run.errors >= concurrency and waited >= warm_s
                if warmed or waited >= max(warm_s, seconds):
                    break
                await asyncio.sleep(0.02)
            cpu_before = _cpu_now(groups)
            run.window_start = time.perf_counter()
            await asyncio.sleep(seconds)
            run.window_end = time.perf_counter()
            cpu_after = _cpu_now(groups)
            run.stopping = True
            await asyncio.gather(*workers)
        finally:
            for worker in workers:
                worker.cancel()
    elapsed = run.window_end - run.window_start
    return Sample(
        seconds=elapsed,
        ok=run.ok,
        errors=run.errors,
        chunks=run.chunks,
        latencies_ms=tuple(run.latencies_ms),
        cpu_share={name: (cpu_after[name] - cpu_before[name]) / elapsed for name in cpu_after},
        first_error=run.first_error,
        answered=run.completed + run.errors,
    )


async def probe(target: Target) -> str | None:
    """None when the path answers one chat completion correctly, else why not."""
    run = _Run(target, stream=False)
    run.window_start = 0.0
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout, auto_decompress=False) as session:
        await run.one(session)
    return None if run.ok else run.first_error
