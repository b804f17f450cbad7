"""`serving profiles list|show|render`: look at profiles without starting anything."""

from __future__ import annotations

import argparse
import json

from serving.ports import ENGINE_PORT


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    sub.add_parser("list", help="the built-in profiles, one line each")
    show = sub.add_parser("show", help="a profile's validated fields as JSON")
    show.add_argument("profile", help="profile name or YAML path")
    render = sub.add_parser("render", help="the vLLM command line a profile starts")
    render.add_argument("profile", help="profile name or YAML path")
    render.add_argument("--host", default="127.0.0.1")
    render.add_argument("--port", type=int, default=ENGINE_PORT)


def run(args: argparse.Namespace) -> int:
    from serving.profiles import load_all_profiles, load_profile

    if args.action == "list":
        for profile in load_all_profiles():
            print(f"{profile.name:28} {profile.description}")
    elif args.action == "show":
        print(json.dumps(load_profile(args.profile).model_dump(), indent=2))
    else:
        from serving.engine.launch import describe_command

        print(describe_command(load_profile(args.profile), host=args.host, port=args.port))
    return 0
