"""`serving gateway`: run the API gateway in front of a vLLM OpenAI server.

    serving gateway --upstream http://127.0.0.1:8001 --port 8000
        # keys: the serving home's keys.db (`serving keys create ...`), plus SERVING_API_KEY
    serving gateway --upstream ... --keys-file /etc/serving/keys.yaml   # e.g. a k8s Secret
    SERVING_GATEWAY_UPSTREAM=http://vllm:8001 SERVING_GATEWAY_LEASE_TTL_S=120 serving gateway

The settings' flags and environment variables are generated from `GatewaySettings` (see
`settings`); this module adds only what is not a setting: `--api-key`, `--admin-key`, `--log-level`,
`--access-log`. `serve_gateway(settings)` runs the server in-process (blocking, until
SIGINT/SIGTERM); `build_server(settings)` returns it without running it. uvicorn and the app
are imported only when the gateway runs, so `serving --help` stays fast.
"""

from __future__ import annotations

import argparse
import gc
from typing import TYPE_CHECKING

from serving import paths
from serving.errors import ServingError
from serving.gateway.setting_names import ENV_PREFIX
from serving.gateway.settings import ADMIN_KEY_ENV, API_KEY_ENV, GatewaySettings, cli_source

if TYPE_CHECKING:
    from serving.gateway.app import GatewayApp
    from serving.gateway.server import DrainingServer

LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
# Container allocations between two young-generation collections (CPython's default: 700).
# A request allocates a few hundred short-lived objects, nearly all freed by reference
# counting, so the default would collect every few requests for next to nothing.
GC_YOUNG_THRESHOLD = 20_000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    cli_source(parser)  # one flag per GatewaySettings field
    parser.add_argument(
        "--api-key",
        action="append",
        dest="api_keys",
        metavar="KEY",
        help=f"a development key (no limits, public id `dev`); repeatable. Prefer "
        f"{API_KEY_ENV} (comma-separated keys): command lines are visible to other users",
    )
    parser.add_argument(
        "--admin-key",
        action="append",
        dest="admin_keys",
        metavar="KEY",
        help=f"a key for the admin API (/admin/: usage reports, runtime adapters); "
        f"repeatable. Prefer {ADMIN_KEY_ENV}: command lines are visible to other users",
    )
    parser.add_argument("--log-level", choices=LOG_LEVELS, default="info")
    parser.add_argument("--access-log", action="store_true", help="log every request")
    parser.epilog = (
        f"Each setting's variable is {ENV_PREFIX}<FIELD>, e.g. {ENV_PREFIX}LEASE_TTL_S; a flag "
        f"beats the environment, which beats the default. The serving home is "
        f"{paths.serving_home()} ({paths.HOME_ENV} if set, else the checkout's var/ or "
        f"~/.cache/qwen-serving), so keys.db defaults to {paths.keys_db_path()}."
    )


def settings_from_args(args: argparse.Namespace) -> GatewaySettings:
    """Settings from parsed flags, then SERVING_GATEWAY_* and SERVING_API_KEY, then defaults."""
    return GatewaySettings.load(
        cli_source()(parsed_args=args),
        api_keys=args.api_keys or (),
        admin_keys=args.admin_keys or (),
    )


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
    tune_gc()
    try:
        server.run()
    except SystemExit as exc:  # uvicorn exits when it cannot bind or start
        raise ServingError(f"--host/--port: could not listen on {where} (see above)") from exc
    if not server.started:
        raise ServingError(f"gateway: startup failed on {where}")


def tune_gc() -> None:
    """Collect less often, and never walk what start-up built (modules, settings, the app:
    it lives as long as the process). Cycles still get collected, once per
    GC_YOUNG_THRESHOLD allocations."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    serve_gateway(settings, log_level=args.log_level, access_log=args.access_log)
    return 0
