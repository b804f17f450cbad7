"""What two pieces of the gateway's request path cost, timed in this process on the bench's
own stream: the structural usage read (`ResponseMeter`) and the one object a request holds
(`HeldRequest`, with its outcome and metrics record).

    costs = measure_pieces()        # {"meter_one_event_per_read_us": ..., ...}
    lines = pieces_lines(costs, gateway_cpu_us_per_stream)

The meter is fed exactly what the upstream sends a stream that asked for usage (its running
usage in every chunk, as the gateway asks vLLM): one event per read, as vLLM writes to a
reader that keeps up, and four per read, as a reader that fell behind gets them. Each figure
is the median of `REPEATS` timings of `NUMBER` runs; the share is of the gateway's own CPU
per stream measured in the same benchmark run.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence

from bench.gateway_overhead.upstream import DONE_CHUNKS, RUNNING_DELTA_CHUNKS, USAGE_CHUNK
from serving.gateway.completions import HeldRequest
from serving.gateway.metrics import RequestRecord
from serving.gateway.usage import ResponseMeter

REPEATS = 5
NUMBER = 2000
EVENTS_PER_LAGGING_READ = 4


def _payload(chunk: bytes) -> bytes:
    """The SSE bytes of one HTTP chunk (`<hex>\\r\\n<payload>\\r\\n`)."""
    return chunk.split(b"\r\n", 1)[1][:-2]


EVENTS = [*map(_payload, RUNNING_DELTA_CHUNKS), _payload(USAGE_CHUNK), _payload(DONE_CHUNKS)]


def _reads(events_per_read: int) -> list[bytes]:
    return [
        b"".join(EVENTS[i : i + events_per_read]) for i in range(0, len(EVENTS), events_per_read)
    ]


def _meter_run(reads: Sequence[bytes]) -> Callable[[], None]:
    def run() -> None:
        # As the gateway meters a chat stream whose client asked for the final usage only.
        meter = ResponseMeter(strip_usage=False, chunk_usage=True, strip_chunk_usage=True)
        for read in reads:
            meter.feed(read)
        meter.end()
        if meter.usage is None:  # a broken read must not pass for a fast one
            raise AssertionError("the meter read no usage from the bench's stream")

    return run


def _held_request() -> None:
    HeldRequest(None, RequestRecord(0.0))  # type: ignore[arg-type]  # only its creation is timed


def _us(run: Callable[[], None]) -> float:
    timings = []
    for _ in range(REPEATS):
        started = time.perf_counter()
        for _ in range(NUMBER):
            run()
        timings.append((time.perf_counter() - started) / NUMBER * 1e6)
    return statistics.median(timings)


def measure_pieces() -> dict[str, float]:
    return {
        "meter_one_event_per_read_us": _us(_meter_run(_reads(1))),
        "meter_lagging_reads_us": _us(_meter_run(_reads(EVENTS_PER_LAGGING_READ))),
        "final_usage_event_us": _us(_meter_run([EVENTS[-2]])),
        "held_request_us": _us(_held_request),
    }


def pieces_lines(costs: Mapping[str, float], gateway_us_per_stream: float) -> list[str]:
    """The section of the results file (none when nothing was measured)."""
    if not costs:
        return []
    rows = [
        ("usage read of one stream, one event per read", "meter_one_event_per_read_us"),
        (f"the same, {EVENTS_PER_LAGGING_READ} events per read", "meter_lagging_reads_us"),
        ("of which the final usage event, parsed as JSON", "final_usage_event_us"),
        ("the one request object (HeldRequest, its outcome, record)", "held_request_us"),
    ]
    lines = [
        "",
        "## What the usage read and the request object cost",
        "",
        f"Timed in the benchmark's own process on the upstream's stream ({len(EVENTS)} events: "
        "20 chunks with running usage, the final usage, [DONE]); median of "
        f"{REPEATS} timings of {NUMBER} runs. Share: of the gateway's CPU per stream above.",
        "",
        "| piece | µs per stream | share of the gateway's CPU per stream |",
        "| --- | --- | --- |",
    ]
    for label, key in rows:
        value = costs[key]
        share = value / gateway_us_per_stream if gateway_us_per_stream > 0 else float("nan")
        lines.append(f"| {label} | {value:.1f} | {share:.1%} |")
    return lines
