"""`python -m monitoring.grafana [--out DIR] [--check]`: regenerate the dashboards' JSON."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from monitoring.grafana.generate import DASHBOARDS_DIR, stale, write_all


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m monitoring.grafana", description=__doc__)
    parser.add_argument("--out", type=Path, default=DASHBOARDS_DIR, help="output directory")
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 when --out is not current"
    )
    args = parser.parse_args(argv)
    if args.check:
        outdated = stale(args.out)
        for name in outdated:
            print(f"{args.out / name}: differs from the code; run python -m monitoring.grafana")
        return 1 if outdated else 0
    for path in write_all(args.out):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
