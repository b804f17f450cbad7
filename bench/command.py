"""What every benchmark's `main()` does around its measurement, written once.

    def main(argv: Sequence[str] | None = None) -> int:
        args = build_parser().parse_args(argv)
        return run_benchmark("routing", run(args))     # run: the measurement, an exit status

The measurement runs on uvloop, as the gateway does. A `BenchError` (a path that cannot be
set up, a flag value found wrong once running) is one line on stderr and exit status 2, the
status argparse gives a bad command line; Ctrl-C, or SIGTERM (`timeout`, a CI job cancelled),
ends it with 130 and no traceback, after the measurement's own clean-up has stopped every
process it started.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Coroutine
from types import FrameType
from typing import Any

import uvloop

from bench.gateway_overhead.processes import BenchError


def run_benchmark(prog: str, measurement: Coroutine[Any, Any, int]) -> int:
    """Run `measurement` to its exit status; `prog` names the benchmark in the message."""
    # SIGTERM ends it as Ctrl-C does: the loop then cancels the measurement, whose `with`
    # blocks stop the engines, gateways and servers it started (left alone, they outlive it).
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        return uvloop.run(measurement)
    except BenchError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt
