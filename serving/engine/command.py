"""`serving engine --profile P`: one supervised vLLM server, bound to loopback by default."""

from __future__ import annotations

import argparse
import signal
import sys
from types import FrameType

from serving.errors import ServingError

DEFAULT_ENGINE_PORT = 8001


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile", default="cpu-tiny", help="profile name or YAML path")
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address vLLM binds (loopback or a cluster-internal address, never public)",
    )
    parser.add_argument("--port", type=int, default=DEFAULT_ENGINE_PORT)
    add_metrics_port_argument(parser)
    parser.add_argument("--log-file", default=None, help="engine log (default under SERVING_HOME)")
    parser.add_argument("--no-restart", action="store_true", help="exit when vLLM dies")
    parser.add_argument("--dry-run", action="store_true", help="print the vLLM command and exit")


def add_metrics_port_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="PORT",
        help="launcher metrics (model load time, peak load memory, restarts) on this port, "
        "bound like vLLM (default: the engine port + 1; 0: off)",
    )


def metrics_port(args: argparse.Namespace, engine_port: int) -> int:
    port: int = engine_port + 1 if args.metrics_port is None else args.metrics_port
    if not 0 <= port < 65536:
        raise ServingError(f"--metrics-port {port}: not a port number")
    return port


def install_stop_handlers() -> None:
    """SIGTERM and SIGINT both unwind as KeyboardInterrupt, so `finally` stops the engine."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def run(args: argparse.Namespace) -> int:
    from serving.engine.launch import build_supervisor, describe_command, serve_launcher_metrics
    from serving.profiles import load_profile

    profile = load_profile(args.profile)
    if args.dry_run:
        print(describe_command(profile, host=args.host, port=args.port))
        return 0
    supervisor = build_supervisor(profile, host=args.host, port=args.port, log_file=args.log_file)
    launcher_port = metrics_port(args, args.port)
    if launcher_port:
        serve_launcher_metrics(supervisor, profile, host=args.host, port=launcher_port)
    install_stop_handlers()
    try:
        seconds = supervisor.start()
        current = supervisor.current
        log_path = current.log_path if current else ""
        print(
            f"\nvLLM ({profile.name}) healthy at http://{args.host}:{args.port} "
            f"after {seconds:.1f}s; log {log_path}",
            file=sys.stderr,
        )
        if current is not None and current.load_stats is not None:
            print(f"load: {current.load_stats.describe()}", file=sys.stderr)
        if launcher_port:
            print(f"launcher metrics: http://{args.host}:{launcher_port}/metrics", file=sys.stderr)
        if args.no_restart:
            while supervisor.current is not None and supervisor.current.exit_code() is None:
                signal.pause()
            return 1
        supervisor.watch()
    except KeyboardInterrupt:
        print("\nstopping vLLM ...", file=sys.stderr)
    finally:
        supervisor.stop()
    return 0
