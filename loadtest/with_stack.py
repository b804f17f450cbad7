"""Run a command against the embedded stack, starting `serving up` first when it is not up.

    python -m loadtest.with_stack --profile cpu-tiny --port 8000 --engine-port 8001 -- CMD...

The command gets the dev key in $SERVING_API_KEY. A stack this script started is stopped
(SIGINT, as Ctrl-C would) when the command ends; one that was already running is left alone.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

from serving.engine.process import http_ok
from serving.ports import ENGINE_PORT, GATEWAY_PORT
from serving.stack import DEV_KEY_ENV, dev_api_key


def _wait_ready(url: str, process: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not http_ok(url):
        if process.poll() is not None:
            raise SystemExit(f"with_stack: serving up exited with code {process.returncode}")
        if time.monotonic() > deadline:
            raise SystemExit(f"with_stack: {url} not ready after {timeout:.0f}s")
        time.sleep(1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.with_stack")
    parser.add_argument("--profile", default="cpu-tiny")
    parser.add_argument("--port", type=int, default=GATEWAY_PORT)
    parser.add_argument("--engine-port", type=int, default=ENGINE_PORT)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for start")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("command: give the command to run after --")
    env = {**os.environ, DEV_KEY_ENV: dev_api_key()}
    started: subprocess.Popen[bytes] | None = None
    if not http_ok(f"http://127.0.0.1:{args.port}/readyz"):
        print(f"with_stack: starting serving up --profile {args.profile}", file=sys.stderr)
        started = subprocess.Popen(
            [sys.executable, "-m", "serving.cli", "up", "--profile", args.profile,
             "--port", str(args.port), "--engine-port", str(args.engine_port)],
            env=env,
        )  # fmt: skip
    try:
        if started is not None:
            _wait_ready(f"http://127.0.0.1:{args.port}/readyz", started, args.timeout)
        return subprocess.call(command, env=env)
    finally:
        if started is not None:
            started.send_signal(signal.SIGINT)
            started.wait(timeout=120)


if __name__ == "__main__":
    sys.exit(main())
