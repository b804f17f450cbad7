"""`serving k8s render`: the engine's Kubernetes patch, generated from a profile.

    serving k8s render --profile qwen2.5-7b-fp16-tp4-4090          # print the patch
    serving k8s render --profile cpu-tiny --out /tmp/engine.yaml   # write it
    serving k8s render --all            # rewrite k8s/overlays/*/engine.generated.yaml
    serving k8s render --all --check    # exit 1 naming each overlay that drifted

No cluster and no network: the patch is computed from the profile and the memory planner.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from serving.errors import ServingError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    render = sub.add_parser(
        "render",
        help="the engine Deployment patch for a profile, or every overlay's",
        description="Render the strategic-merge patch of Deployment engine (and the "
        "model-cache PVC size) that an overlay applies, from a profile.",
    )
    which = render.add_mutually_exclusive_group(required=True)
    which.add_argument("--profile", help="profile name or YAML path")
    which.add_argument(
        "--all", action="store_true", help="write every overlay's engine.generated.yaml"
    )
    render.add_argument("--out", type=Path, metavar="FILE", help="with --profile: write FILE")
    render.add_argument(
        "--check",
        action="store_true",
        help="with --all: write nothing; exit 1 naming each overlay whose file differs",
    )
    render.add_argument(
        "--root",
        type=Path,
        metavar="DIR",
        help="with --all: the repository holding k8s/overlays (default: this checkout)",
    )


def _root(given: Path | None) -> Path:
    from serving.paths import source_checkout

    root = given if given is not None else source_checkout()
    if root is None:
        raise ServingError("--root: not running from a source checkout; give the repository")
    if not (root / "k8s").is_dir():
        raise ServingError(f"--root: {root} has no k8s directory")
    return root


def _render_one(args: argparse.Namespace) -> int:
    from serving.k8s.engine_patch import render_patch
    from serving.profiles.loader import load_profile

    if args.check or args.root is not None:
        raise ServingError("--check and --root: only with --all")
    try:
        profile = load_profile(args.profile)
    except ServingError as exc:
        raise ServingError(f"--profile: {exc}") from None
    text = render_patch(profile)
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text, encoding="utf-8")
    return 0


def _render_all(args: argparse.Namespace) -> int:
    from serving.k8s.overlays import stale_overlays, write_overlays

    if args.out is not None:
        raise ServingError("--out: only with --profile (--all writes each overlay's file)")
    root = _root(args.root)
    if args.check:
        stale = stale_overlays(root)
        for rendered in stale:
            print(
                f"{rendered.path.relative_to(root)}: differs from profile {rendered.profile} "
                f"(overlay {rendered.overlay})",
                file=sys.stderr,
            )
        if stale:
            print("run `serving k8s render --all` to regenerate", file=sys.stderr)
        return 1 if stale else 0
    for rendered in write_overlays(root):
        print(f"wrote {rendered.path.relative_to(root)} (profile {rendered.profile})")
    return 0


def run(args: argparse.Namespace) -> int:
    return _render_all(args) if args.all else _render_one(args)
