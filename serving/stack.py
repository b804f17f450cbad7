"""`serving up`: the whole stack on one machine: model, supervised vLLM, gateway in front.

vLLM listens on loopback only; the gateway is the one port clients use. Ctrl-C (or SIGTERM)
stops the gateway first, so no new request reaches an engine that is going away.

`--replicas N` runs N engines of the profile, each supervised on its own pair of ports
(engine port + 2i, its launcher metrics on the next one), and the gateway routes over all of
them (`--routing`): the scale-out topology on one machine, for trying it out.

`--profile` repeats: `--profile cpu-tiny --profile cpu-tiny-embedding` runs a chat engine and
a pooling engine (embeddings) behind the one gateway, which sends each request to the engines
serving its model; the first profile's engines take the first ports (`serving.stack_engines`).

The gateway serves every series, each key's spend too, on a metrics port of its own
(`--gateway-metrics-port`, `serving.ports.GATEWAY_METRICS_PORT` by default), the one
`make monitor`'s Prometheus scrapes; its API port's /metrics has the aggregate series only.
"""

from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from serving.engine.command import (
    DEFAULT_ENGINE_PORT,
    add_metrics_port_argument,
    hold_stop_signals,
    install_stop_handlers,
    metrics_port,
)
from serving.engine.lifeline import with_lifeline
from serving.engine.load_stats import LoadStats
from serving.engine.port_check import refuse_taken
from serving.engine.process import http_ok, terminate
from serving.engine.supervisor import Supervisor
from serving.errors import ServingError
from serving.gateway.setting_names import flag_name
from serving.gateway.settings import API_KEY_ENV, GatewaySettings, split_dev_keys
from serving.paths import dev_api_key_path, keys_db_path, logs_dir
from serving.ports import GATEWAY_METRICS_PORT, GATEWAY_PORT
from serving.stack_engines import (
    MAX_ENGINES,
    StackEngine,
    chat_profile,
    gateway_stack_settings,
    stack_engines,
)

if TYPE_CHECKING:
    from serving.engine.launcher_metrics import LauncherMetrics
    from serving.profiles.model import Profile

DEV_KEY_ENV = API_KEY_ENV
DEFAULT_PROFILE = "cpu-tiny"
# The gateway drains its streams for up to --graceful-timeout after SIGTERM; it is killed only
# if it is still there well after that.
GATEWAY_STOP_S = GatewaySettings.model_fields["graceful_shutdown_s"].default + 10.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--profile",
        action="append",
        default=None,
        metavar="PROFILE",
        help=f"profile name or YAML path; repeat it to serve more models, each on engines of "
        f"its own, the first profile's first (default: {DEFAULT_PROFILE})",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address the gateway binds")
    parser.add_argument("--port", type=int, default=GATEWAY_PORT, help="gateway port")
    parser.add_argument(
        "--engine-port",
        type=int,
        default=DEFAULT_ENGINE_PORT,
        help="the first engine's port; engine i listens on this + 2i (default: %(default)s)",
    )
    add_metrics_port_argument(parser)
    parser.add_argument(
        "--gateway-metrics-port",
        type=int,
        default=GATEWAY_METRICS_PORT,
        metavar="PORT",
        help="the gateway's metrics port, on --host: every series, per key too; the API "
        "port's /metrics has the aggregate ones only (default: %(default)s)",
    )
    parser.add_argument(
        "--replicas",
        type=_replica_count,
        default=1,
        metavar="N",
        help="vLLM engines to run of each profile, the gateway routing over them "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--routing",
        choices=("affinity", "least-loaded", "round-robin"),
        default="affinity",
        help="how the gateway spreads requests over the engines (default: %(default)s)",
    )
    parser.add_argument(
        "--scheduling",
        choices=("fair", "fcfs"),
        default="fair",
        help="fair: the gateway runs at most the profile's max_num_seqs per engine and keys "
        "take fair turns for the rest; fcfs: vLLM's own queue (default: %(default)s)",
    )
    parser.add_argument(
        "--keys-db",
        default=None,
        metavar="PATH",
        help="key store the gateway uses, as written by `serving keys create --store PATH` "
        f"(default: {keys_db_path()}, where `serving keys` writes)",
    )


def _replica_count(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= MAX_ENGINES:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of engines from 1 to {MAX_ENGINES}"
        )
    return int(text)


def dev_api_key() -> str:
    """The development key: the first in $SERVING_API_KEY, else one generated once and kept
    (mode 0600) in the serving home."""
    configured = split_dev_keys(os.environ.get(DEV_KEY_ENV, ""))
    if configured:
        return configured[0]
    path = dev_api_key_path()
    if path.exists():
        return path.read_text(encoding="utf-8").strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    key = "sk-dev-" + secrets.token_urlsafe(24)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(key + "\n")
    return key


def start_gateway(
    upstream: str,
    host: str,
    port: int,
    api_key: str,
    keys_db: str | None = None,
    routing: str = "affinity",
    settings: Mapping[str, int | str] | None = None,
) -> subprocess.Popen[bytes]:
    """The gateway in front of `upstream` (one engine's URL, or several comma-separated):
    keys from `keys_db` (default `paths.keys_db_path()`, managed with `serving keys`) plus
    the development key `api_key` (public id `dev`; the keys of a configured SERVING_API_KEY
    all stay valid); `settings`, more gateway settings by field name."""
    log_path = logs_dir() / "gateway.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "serving.cli", "gateway", "--upstream", upstream]
    argv += ["--host", host, "--port", str(port), "--routing", routing]
    argv += ["--keys-db", keys_db or str(keys_db_path())]
    # No load balancer watches /readyz here: stop at once on SIGTERM (in-flight requests
    # still finish).
    argv += ["--drain-delay", "0"]
    for name, value in (settings or {}).items():
        argv += [flag_name(name), str(value)]
    # The key travels in the environment, never on a command line that `ps` shows.
    env = dict(os.environ)
    if api_key not in split_dev_keys(env.get(DEV_KEY_ENV, "")):
        env[DEV_KEY_ENV] = api_key
    with log_path.open("ab") as log:
        # Its own session: a signal to the launcher's group reaches the launcher alone, which
        # stops the gateway (it drains) before vLLM; the lifeline stops it if the launcher dies.
        process = subprocess.Popen(
            with_lifeline(argv),
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServingError(f"gateway exited with code {process.returncode}; see {log_path}")
        if http_ok(f"http://{host}:{port}/healthz"):
            return process
        time.sleep(0.2)
    process.terminate()
    raise ServingError(f"gateway did not answer /healthz within 30s; see {log_path}")


def banner(
    url: str,
    model: str,
    api_key: str,
    engine_seconds: float,
    profile: str,
    load: LoadStats | None = None,
    launcher_metrics: str | None = None,
    engines: int = 1,
    *,
    metrics_url: str,
    pooling: tuple[str, ...] = (),
) -> str:
    """What `serving up` prints once serving: `model` is the chat model ("" when every
    profile pools), `pooling` the pooling models."""
    load_line = f"\nModel load: {load.describe()}." if load is not None else ""
    launcher_line = f"\n  engine launcher metrics: {launcher_metrics}" if launcher_metrics else ""
    what = "vLLM" if engines == 1 else f"{engines} vLLM engines (the gateway routes over them)"
    served = ", ".join(name for name in (model, *pooling) if name)
    pooling_line = (
        f"\n  pooling models (embeddings, scores): {', '.join(pooling)}" if pooling else ""
    )
    try_it = (
        f"""
Try it:
  python - <<'PY'
  from openai import OpenAI
  client = OpenAI(base_url="{url}/v1", api_key="{api_key}")
  reply = client.chat.completions.create(
      model="{model}", messages=[{{"role": "user", "content": "Tell me about the weather."}}],
      max_tokens=32)
  print(reply.choices[0].message.content)
  PY
"""
        if model
        else ""
    )
    return f"""
Serving {served} (profile {profile}); {what} became healthy in {engine_seconds:.1f}s.{load_line}

  API:      {url}/v1
  API key:  {api_key}
  metrics:  {metrics_url}/metrics (per key; the API port's /metrics: totals only)
  health:   {url}/healthz  {url}/readyz{launcher_line}{pooling_line}
  playground (chat in the browser): {url}/playground
{try_it}
Ctrl-C stops the gateway and the engines.
"""


def run(args: argparse.Namespace) -> int:
    from serving.engine.launch import build_supervisor, serve_launcher_metrics
    from serving.profiles import load_profile

    profiles = [load_profile(name) for name in args.profile or [DEFAULT_PROFILE]]
    api_key = dev_api_key()
    launcher_metrics: list[LauncherMetrics] = []

    def record_stop_signal(name: str) -> None:
        for metrics in launcher_metrics:
            metrics.record_stop_signal(name)

    install_stop_handlers(record_stop_signal)
    launcher_port = metrics_port(args, args.engine_port)
    engines = stack_engines(
        profiles,
        replicas=args.replicas,
        engine_port=args.engine_port,
        launcher_port=launcher_port,
    )
    supervisors = [
        build_supervisor(
            engine.profile,
            host="127.0.0.1",
            port=engine.port,
            log_file=None if len(engines) == 1 else str(engine_log(engine)),
        )
        for engine in engines
    ]
    ports = [engine.port for engine in engines]
    launchers = [engine.launcher_port for engine in engines if engine.launcher_port]
    check_gateway_metrics_port(args.gateway_metrics_port, args.port, ports, launchers)
    gateway_ports = {args.port: "the gateway's (--port)"}
    gateway_ports[args.gateway_metrics_port] = "the gateway metrics' (--gateway-metrics-port)"
    refuse_taken(gateway_ports, host=args.host)
    refuse_taken(
        {port: "an engine's (--engine-port + 2i)" for port in ports}
        | {port: "an engine launcher's (--metrics-port)" for port in launchers}
    )
    launcher_urls: list[str] = []
    for engine, supervisor in zip(engines, supervisors, strict=True):
        if engine.launcher_port:
            launcher_metrics.append(
                serve_launcher_metrics(
                    supervisor, engine.profile, host="127.0.0.1", port=engine.launcher_port
                )
            )
            launcher_urls.append(f"http://127.0.0.1:{engine.launcher_port}/metrics")
    gateway: subprocess.Popen[bytes] | None = None
    watch_error: list[BaseException] = []

    def watch(supervisor: Supervisor) -> None:
        try:
            supervisor.watch()
        except ServingError as exc:
            watch_error.append(exc)

    try:
        for supervisor in supervisors:  # the engines load side by side
            supervisor.launch()
        engine_seconds = max(supervisor.wait_started() for supervisor in supervisors)
        chat = chat_profile(profiles)
        gateway = start_gateway(
            ",".join(engine.url for engine in engines),
            args.host,
            args.port,
            api_key,
            args.keys_db,
            routing=args.routing,
            settings={
                "metrics_port": args.gateway_metrics_port,
                **gateway_image_settings(chat),
                **gateway_stack_settings(
                    profiles, replicas=args.replicas, scheduling=args.scheduling
                ),
            },
        )
        first = supervisors[0].current
        print(
            banner(
                f"http://{args.host}:{args.port}",
                chat.served_model_name if chat.runner == "generate" else "",
                api_key,
                engine_seconds,
                ", ".join(profile.name for profile in profiles),
                first.load_stats if first else None,
                " ".join(launcher_urls) or None,
                engines=len(supervisors),
                metrics_url=f"http://{args.host}:{args.gateway_metrics_port}",
                pooling=tuple(p.served_model_name for p in profiles if p.runner == "pooling"),
            ),
            flush=True,
        )
        watchers = [
            threading.Thread(
                target=watch, args=(supervisor,), name="engine-supervisor", daemon=True
            )
            for supervisor in supervisors
        ]
        for watcher in watchers:
            watcher.start()
        while all(watcher.is_alive() for watcher in watchers):
            if gateway.poll() is not None:
                raise ServingError(
                    f"gateway exited with code {gateway.returncode}; "
                    f"see {logs_dir() / 'gateway.log'}"
                )
            time.sleep(0.5)
        if watch_error:
            raise watch_error[0]
    except KeyboardInterrupt:
        print("\nstopping gateway and vLLM ...", file=sys.stderr)
    finally:
        hold_stop_signals()
        if gateway is not None:
            terminate(gateway, GATEWAY_STOP_S)
        for supervisor in supervisors:
            supervisor.stop()
    return 0


def check_gateway_metrics_port(
    port: int, gateway_port: int, engine_ports: list[int], launcher_ports: list[int]
) -> None:
    """Refuse a gateway metrics port that another of the stack's servers takes, before any
    of them starts (a bind error after the engines loaded would cost their load time)."""
    if not 0 < port < 65536:
        raise ServingError(f"--gateway-metrics-port {port}: not a port number")
    taken = {gateway_port: "the gateway's (--port)"}
    taken |= {engine: "an engine's (--engine-port + 2i)" for engine in engine_ports}
    taken |= {launcher: "an engine launcher's (--metrics-port)" for launcher in launcher_ports}
    if port in taken:
        raise ServingError(
            f"--gateway-metrics-port {port} is also {taken[port]} port: choose another"
        )


def gateway_image_settings(profile: Profile) -> dict[str, int]:
    """The served model's image rule and the profile's images per prompt, for the gateway's
    image token estimate (`gateway.model_images`)."""
    from serving.engine.hf_cache import cached_checkpoint, hub_cache_dir, is_hub_name
    from serving.engine.resolve import resolve_model
    from serving.gateway.model_images import image_settings

    model = resolve_model(profile)  # a built model is cached by now: no second build
    model_dir: Path | None = Path(model)
    if not Path(model).is_dir():
        cache = hub_cache_dir(os.environ)
        model_dir = cached_checkpoint(model, cache) if is_hub_name(model) else None
    limit = profile.limit_mm_per_prompt.get("image")
    if model_dir is None:
        return {} if limit is None else {"max_images_per_request": limit}
    return image_settings(model_dir, limit=limit)


def engine_log(engine: StackEngine) -> Path:
    """An engine's vLLM log when `serving up` runs several."""
    return logs_dir() / f"engine-{engine.profile.name}-{engine.replica}.log"


__all__ = ["add_arguments", "dev_api_key", "run"]
