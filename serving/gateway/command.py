"""`serving gateway`: run the API gateway in front of a vLLM OpenAI server.

    serving gateway --upstream http://127.0.0.1:8001 --port 8000
        # keys: $SERVING_HOME/keys.db (`serving keys create ...`), plus SERVING_API_KEY if set
    serving gateway --upstream ... --keys-file /etc/serving/keys.yaml   # e.g. a k8s Secret

`serve_gateway(settings)` runs the same server in-process (blocking, until SIGINT/SIGTERM);
`build_server(settings)` returns the server without running it. uvicorn and the app are
imported only when the gateway runs, so `serving --help` stays fast.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from serving.errors import ServingError
from serving.gateway.settings import API_KEY_ENV, ENV_PREFIX, GatewaySettings
from serving.paths import serving_home

if TYPE_CHECKING:
    from serving.gateway.app import GatewayApp
    from serving.gateway.server import DrainingServer

LOG_LEVELS = ("critical", "error", "warning", "info", "debug")

# flag dest -> settings field, for the optional numeric flags
_OPTIONAL = {
    "max_body_bytes": "max_body_bytes",
    "upstream_idle_timeout": "upstream_idle_timeout_s",
    "upstream_connect_timeout": "upstream_connect_timeout_s",
    "header_timeout": "header_timeout_s",
    "body_timeout": "body_timeout_s",
    "default_max_tokens": "default_max_tokens",
    "drain_delay": "drain_delay_s",
    "graceful_timeout": "graceful_shutdown_s",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--upstream",
        default=os.environ.get(ENV_PREFIX + "UPSTREAM"),
        help=f"base URL of the vLLM OpenAI server, e.g. http://127.0.0.1:8001 "
        f"(required; or {ENV_PREFIX}UPSTREAM)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on")
    parser.add_argument(
        "--keys-db",
        default=os.environ.get(ENV_PREFIX + "KEYS_DB"),
        metavar="PATH",
        help="key store written by `serving keys` (default: $SERVING_HOME/keys.db unless "
        "--keys-file is given); day/month budgets are persisted in it",
    )
    parser.add_argument(
        "--keys-file",
        default=os.environ.get(ENV_PREFIX + "KEYS_FILE"),
        metavar="PATH",
        help="declarative keys file (YAML/JSON of hashed keys, e.g. a mounted Secret); "
        "re-read when it changes",
    )
    parser.add_argument(
        "--api-key",
        action="append",
        dest="api_keys",
        metavar="KEY",
        help=f"a development key (no limits, public id `dev`); repeatable. Prefer "
        f"{API_KEY_ENV} (comma-separated): command lines are visible to other users",
    )
    parser.add_argument(
        "--max-body-bytes", type=int, default=None, help="largest request body (default 10 MiB)"
    )
    parser.add_argument(
        "--upstream-idle-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="longest upstream silence before 504 (default 300)",
    )
    parser.add_argument(
        "--upstream-connect-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="time to connect to the upstream before 503 (default 5)",
    )
    parser.add_argument(
        "--header-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="time to receive request headers, else 408 (default 10)",
    )
    parser.add_argument(
        "--body-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="time to receive a request body, else 408 (default 30)",
    )
    parser.add_argument(
        "--default-max-tokens",
        type=int,
        default=None,
        metavar="N",
        help="max_tokens when neither client nor key sets one (default 4096, capped by the "
        "model's context)",
    )
    parser.add_argument(
        "--drain-delay",
        type=float,
        default=None,
        metavar="SECONDS",
        help="on SIGTERM, seconds /readyz fails while requests are still served (default 5)",
    )
    parser.add_argument(
        "--graceful-timeout",
        type=int,
        default=None,
        metavar="SECONDS",
        help="then, how long in-flight requests may finish (default 30)",
    )
    parser.add_argument("--log-level", choices=LOG_LEVELS, default="info")
    parser.add_argument("--access-log", action="store_true", help="log every request")


def settings_from_args(
    args: argparse.Namespace, environ: dict[str, str] | None = None
) -> GatewaySettings:
    """Settings from parsed flags; development keys from --api-key, else SERVING_API_KEY."""
    env = dict(os.environ) if environ is None else environ
    if not args.upstream:
        raise ServingError(f"--upstream: required (or set {ENV_PREFIX}UPSTREAM)")
    keys: list[str] = list(args.api_keys or [])
    if not keys:
        keys = [key.strip() for key in env.get(API_KEY_ENV, "").split(",") if key.strip()]
    keys_db = args.keys_db
    if not keys_db and not args.keys_file:
        keys_db = str(_serving_home(env) / "keys.db")
    options: dict[str, object] = {
        "host": args.host,
        "port": args.port,
        "keys_db": keys_db or None,
        "keys_file": args.keys_file or None,
    }
    for flag, field in _OPTIONAL.items():
        value = getattr(args, flag)
        if value is not None:
            options[field] = value
    return GatewaySettings.create(upstream=args.upstream, api_keys=keys, **options)


def _serving_home(env: dict[str, str]) -> Path:
    configured = env.get("SERVING_HOME")
    return Path(configured).expanduser().resolve() if configured else serving_home()


def build_server(
    settings: GatewaySettings,
    *,
    app: GatewayApp | None = None,
    log_level: str = "info",
    access_log: bool = False,
) -> DrainingServer:
    """The uvicorn server (uvloop, httptools, lifespan on) running the gateway app."""
    from serving.gateway.server import build_server as build

    return build(settings, app=app, log_level=log_level, access_log=access_log)


def serve_gateway(
    settings: GatewaySettings, *, log_level: str = "info", access_log: bool = False
) -> None:
    """Serve until SIGINT/SIGTERM, in this process (call it from the main thread)."""
    server = build_server(settings, log_level=log_level, access_log=access_log)
    where = f"{settings.host}:{settings.port}"
    try:
        server.run()
    except SystemExit as exc:  # uvicorn exits when it cannot bind or start
        raise ServingError(f"--host/--port: could not listen on {where} (see above)") from exc
    if not server.started:
        raise ServingError(f"gateway: startup failed on {where}")


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    serve_gateway(settings, log_level=args.log_level, access_log=args.access_log)
    return 0
