"""What every benchmark's `main()` does around its measurement, written once.

    def main(argv: Sequence[str] | None = None) -> int:
        args = build_parser().parse_args(argv)
        return run_benchmark("routing", run(args))     # run: the measurement, an exit status

The measurement runs on uvloop, as the gateway does. A `BenchError` (a path that cannot be
set up, a flag value found wrong once running) is one line on stderr and exit status 2, the
status argparse gives a bad command line; Ctrl-C ends it with 130 and no traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Coroutine
from typing import Any

import uvloop

from bench.gateway_overhead.processes import BenchError


def run_benchmark(prog: str, measurement: Coroutine[Any, Any, int]) -> int:
    """Run `measurement` to its exit status; `prog` names the benchmark in the message."""
    try:
        return uvloop.run(measurement)
    except BenchError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
