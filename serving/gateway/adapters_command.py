"""`serving adapters`: load, unload and list LoRA adapters on every engine, through a gateway.

    SERVING_ADMIN_KEY=... serving adapters load team-a-lora /adapters/team-a
    SERVING_ADMIN_KEY=... serving adapters list --gateway http://gateway:8000
    SERVING_ADMIN_KEY=... serving adapters unload team-a-lora

A client of the gateway's admin API (`adapters.admin`): the gateway must run with
`--runtime-adapters` and an admin key, and the admin key is read from SERVING_ADMIN_KEY only
(a flag would show it to every user of the machine). The path is a directory on the engines'
filesystem, not this machine's. Errors are one line: the gateway's own message, or why it
could not be reached; exit status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import urllib.error
import urllib.request

from serving.errors import ServingError
from serving.gateway.settings import ADMIN_KEY_ENV, split_dev_keys
from serving.ports import GATEWAY_PORT

PATH = "/admin/v1/adapters"
TIMEOUT_S = 120.0  # a load waits for every engine to read the adapter


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--gateway",
        default=f"http://127.0.0.1:{GATEWAY_PORT}",
        metavar="URL",
        help="the gateway's base URL (default: %(default)s)",
    )
    actions = parser.add_subparsers(dest="adapters_command", required=True, metavar="ACTION")
    actions.add_parser("list", help="the adapters loaded at run time, and where each one is")
    load = actions.add_parser("load", help="load an adapter on every engine, and keep it")
    load.add_argument("name", metavar="NAME", help="the model name clients will send")
    load.add_argument("path", metavar="PATH", help="its directory on the engines' filesystem")
    unload = actions.add_parser("unload", help="unload an adapter from every engine")
    unload.add_argument("name", metavar="NAME")


def run(args: argparse.Namespace) -> int:
    keys = split_dev_keys(os.environ.get(ADMIN_KEY_ENV, ""), where=ADMIN_KEY_ENV)
    if not keys:
        raise ServingError(f"{ADMIN_KEY_ENV}: set it to the gateway's admin key")
    base = args.gateway.rstrip("/")
    if args.adapters_command == "list":
        entries = _call("GET", base + PATH, keys[0]).get("data")
        if not isinstance(entries, list) or not entries:
            print("no adapters loaded at run time")
            return 0
        for entry in entries:
            print(_line(entry))
    elif args.adapters_command == "load":
        body = {"name": args.name, "path": args.path}
        print(_line(_call("POST", base + PATH, keys[0], body)))
    else:
        print(_line(_call("DELETE", f"{base}{PATH}/{args.name}", keys[0])))
    return 0


def _line(entry: dict[str, object]) -> str:
    engines = entry.get("engines")
    problems = entry.get("problems")
    text = f"{entry.get('name')}  {entry.get('state')}  {entry.get('path')}  engines: "
    text += ", ".join(str(e) for e in engines) if isinstance(engines, list) and engines else "none"
    if isinstance(problems, dict) and problems:
        text += "  problems: " + "; ".join(f"{k}: {v}" for k, v in problems.items())
    return text


def _call(method: str, url: str, key: str, body: object = None) -> dict[str, object]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Authorization", f"Bearer {key}")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            answer = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise ServingError(f"the gateway answered {exc.code}: {_message(exc.read())}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ServingError(f"--gateway {url.split('/admin/')[0]}: {exc}") from None
    if not isinstance(answer, dict):
        raise ServingError("the gateway's answer is not a JSON object")
    return answer


def _message(raw: bytes) -> str:
    try:
        error = json.loads(raw)["error"]
        return str(error["message"])
    except (ValueError, KeyError, TypeError):
        return raw.decode(errors="replace")[:300]
