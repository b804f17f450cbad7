"""`serving model`: build the models the stack ships instead of downloading.

`serving model tiny [--out DIR] [--force] [--steps N]` builds (or finds cached) the embedded
Qwen3 model and prints its directory on stdout, so `$(serving model tiny)` works in scripts.
Each kind of model is a sub-command here, so `serving model awq ...` can join later.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from serving.errors import ServingError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    kinds = parser.add_subparsers(dest="model_kind", required=True, metavar="KIND")
    tiny = kinds.add_parser(
        "tiny",
        help="build the embedded tiny Qwen3 model (cached)",
        description=(
            "Train a small Qwen3 model on the shipped corpus, deterministically, and save it "
            "as a checkpoint vLLM can serve. A build with the same inputs is reused."
        ),
    )
    tiny.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="directory to build into (default: $SERVING_HOME/models/qwen3-tiny)",
    )
    tiny.add_argument("--force", action="store_true", help="rebuild even if a build is cached")
    tiny.add_argument(
        "--steps",
        type=int,
        default=None,
        metavar="N",
        help="training steps instead of the default (fewer: quicker, worse text; for tests)",
    )
    tiny.set_defaults(_model_run=_run_tiny)


def run(args: argparse.Namespace) -> int:
    result: int = args._model_run(args)
    return result


def _run_tiny(args: argparse.Namespace) -> int:
    # Imported here: the builder pulls in `tokenizers` (its child process pulls in torch).
    from serving.engine.tiny_model import ensure_tiny_model

    if args.steps is not None and args.steps < 1:
        raise ServingError(f"--steps {args.steps}: must be at least 1")
    path = ensure_tiny_model(args.out, force=args.force, steps=args.steps)
    print(path)
    return 0
