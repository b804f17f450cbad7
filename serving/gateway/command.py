"""`serving gateway`: run the API gateway in front of a vLLM OpenAI server.

    serving gateway --upstream http://127.0.0.1:8001 --port 8000   # key from SERVING_API_KEY

`serve_gateway(settings)` runs the same server in-process (blocking, until SIGINT/SIGTERM);
`build_server(settings)` returns the uvicorn server without running it. uvicorn and the app
are imported only when the gateway runs, so `serving --help` stays fast.
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from serving.errors import ServingError
from serving.gateway.settings import API_KEY_ENV, ENV_PREFIX, GatewaySettings

if TYPE_CHECKING:
    import uvicorn

LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


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
        "--api-key",
        action="append",
        dest="api_keys",
        metavar="KEY",
        help=f"an accepted API key; repeatable. Prefer {API_KEY_ENV} (comma-separated): "
        "command lines are visible to other users",
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
    parser.add_argument("--log-level", choices=LOG_LEVELS, default="info")
    parser.add_argument("--access-log", action="store_true", help="log every request")


def settings_from_args(
    args: argparse.Namespace, environ: dict[str, str] | None = None
) -> GatewaySettings:
    """Settings from parsed flags; API keys from --api-key, else SERVING_API_KEY."""
    env = dict(os.environ) if environ is None else environ
    if not args.upstream:
        raise ServingError(f"--upstream: required (or set {ENV_PREFIX}UPSTREAM)")
    keys: list[str] = list(args.api_keys or [])
    if not keys:
        keys = [key.strip() for key in env.get(API_KEY_ENV, "").split(",") if key.strip()]
    if not keys:
        raise ServingError(f"--api-key: required (or set {API_KEY_ENV})")
    options: dict[str, object] = {"host": args.host, "port": args.port}
    for flag, field in (
        ("max_body_bytes", "max_body_bytes"),
        ("upstream_idle_timeout", "upstream_idle_timeout_s"),
        ("upstream_connect_timeout", "upstream_connect_timeout_s"),
    ):
        value = getattr(args, flag)
        if value is not None:
            options[field] = value
    return GatewaySettings.create(upstream=args.upstream, api_keys=keys, **options)


def build_server(
    settings: GatewaySettings, *, log_level: str = "info", access_log: bool = False
) -> uvicorn.Server:
    """A uvicorn server (uvloop, httptools, lifespan on) running the gateway app."""
    import copy

    import uvicorn
    from uvicorn.config import LOGGING_CONFIG

    from serving.gateway.app import create_app

    # uvicorn's own logging, plus the gateway's loggers on the same handler and level.
    log_config = copy.deepcopy(LOGGING_CONFIG)
    log_config["loggers"]["serving"] = {
        "handlers": ["default"],
        "level": log_level.upper(),
        "propagate": False,
    }
    config = uvicorn.Config(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        http="httptools",
        ws="none",
        lifespan="on",
        log_config=log_config,
        log_level=log_level,
        access_log=access_log,
        timeout_graceful_shutdown=settings.graceful_shutdown_s,
    )
    return uvicorn.Server(config)


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
