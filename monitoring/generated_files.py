"""Committed files generated from code: write them, say which are stale, and the `--check` CLI.

    write_files(render_all(), directory)            # [paths written]
    stale_files(render_all(), directory, "*.json")  # names regenerating would change/add/remove
    sys.exit(generator_main("python -m monitoring.grafana", doc, directory, render_all, "*.json"))

The Grafana dashboards (monitoring/grafana) and the Kubernetes objects (monitoring/kubernetes)
are both committed beside the code that makes them; a test fails while they differ.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path


def write_files(files: dict[str, str], directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in files.items():
        path = directory / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def stale_files(files: dict[str, str], directory: Path, pattern: str) -> list[str]:
    """Names in `directory` (matching `pattern`) that writing `files` would change, add or
    remove."""
    present = {path.name for path in directory.glob(pattern)}
    changed = [
        name
        for name, text in files.items()
        if name not in present or (directory / name).read_text(encoding="utf-8") != text
    ]
    return sorted(changed + sorted(present - files.keys()))


def generator_main(
    prog: str,
    description: str | None,
    default_dir: Path,
    render_all: Callable[[], dict[str, str]],
    pattern: str,
    argv: Sequence[str] | None = None,
) -> int:
    """`prog [--out DIR] [--check]`: write the files, or with --check write nothing and exit
    1 naming each stale one."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--out", type=Path, default=default_dir, help="output directory")
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 when --out is not current"
    )
    args = parser.parse_args(argv)
    if args.check:
        outdated = stale_files(render_all(), args.out, pattern)
        for name in outdated:
            print(f"{args.out / name}: differs from what {prog} writes; run {prog}")
        return 1 if outdated else 0
    for path in write_files(render_all(), args.out):
        print(f"wrote {path}")
    return 0
