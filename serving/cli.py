"""The `serving` command: one sub-command per capability.

Each sub-command lives beside the code it drives and exposes `add_arguments(parser)` and
`run(args) -> int`; heavy imports (torch, vLLM) happen inside `run` so `serving plan` or
`serving keys` start instantly.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Protocol

from serving.errors import ServingError

# name -> (module that implements it, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "up": ("serving.stack", "build the model if needed, start the engine and the gateway"),
    "engine": ("serving.engine.command", "start a supervised vLLM engine for a profile"),
    "gateway": ("serving.gateway.command", "run the API gateway in front of vLLM"),
    "model": ("serving.engine.model_command", "build the embedded tiny Qwen model"),
    "profiles": ("serving.profiles.command", "list, show and render deployment profiles"),
    "plan": ("serving.planner.command", "memory plan for a profile or for flags"),
    "keys": ("serving.gateway.keys_command", "create, list, show and revoke API keys"),
    "usage": ("serving.gateway.usage_command", "usage reports: tokens per key, model and day"),
    "batches": ("serving.gateway.batches_command", "list every key's Batch API batches"),
    "adapters": ("serving.gateway.adapters_command", "load and unload LoRA adapters at run time"),
    "k8s": ("serving.k8s.command", "render the engine's Kubernetes patch from a profile"),
}


class SubCommand(Protocol):
    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


def _load(module_name: str) -> SubCommand:
    module = importlib.import_module(module_name)
    return module


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="serving", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_text, description=help_text)
        _load(module_name).add_arguments(sub_parser)
        sub_parser.set_defaults(_module=module_name)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return _load(args._module).run(args)
    except ServingError as exc:
        print(f"serving {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
