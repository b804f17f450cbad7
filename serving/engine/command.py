"""`serving engine --profile P`: one supervised vLLM server, bound to loopback by default."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from serving.errors import ServingError
from serving.ports import ENGINE_PORT

if TYPE_CHECKING:
    from serving.engine.ray_cluster import RayNodeProcess
    from serving.profiles.model import Profile

DEFAULT_ENGINE_PORT = ENGINE_PORT


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
    add_ray_arguments(parser)


def add_ray_arguments(parser: argparse.ArgumentParser) -> None:
    ray = parser.add_argument_group(
        "Ray (profiles with distributed_executor_backend: ray)",
        "vLLM joins the Ray cluster RAY_ADDRESS names; --ray-head starts that cluster's head "
        "here first (other machines join it with `ray start --address HOST:PORT`).",
    )
    ray.add_argument("--ray-head", action="store_true", help="start the Ray head beside vLLM")
    ray.add_argument("--ray-port", type=int, default=6379, help="the head's port (default 6379)")
    ray.add_argument("--ray-node-ip", default=None, help="this node's address for other nodes")
    ray.add_argument("--ray-num-cpus", type=int, default=None, help="CPUs this node offers Ray")
    ray.add_argument("--ray-num-gpus", type=int, default=None, help="GPUs this node offers Ray")
    ray.add_argument("--ray-temp-dir", default=None, help="Ray's session directory root")
    ray.add_argument(
        "--ray-port-block",
        type=int,
        default=None,
        metavar="PORT",
        help="put every other port of the head into PORT..PORT+63 (default: Ray's ports)",
    )


def ray_head(args: argparse.Namespace, profile: Profile) -> RayNodeProcess | None:
    """The Ray head `--ray-head` asks for; refuses a Ray profile that would find no cluster."""
    from serving.engine.ray_cluster import RayNode, RayNodeProcess
    from serving.paths import logs_dir

    uses_ray = profile.distributed_executor_backend == "ray"
    if args.ray_head and not uses_ray:
        raise ServingError(
            f"--ray-head: profile {profile.name} does not run on Ray "
            f"(distributed_executor_backend: {profile.distributed_executor_backend})"
        )
    if not args.ray_head:
        if profile.nodes > 1 and not os.environ.get("RAY_ADDRESS"):
            raise ServingError(
                f"profile {profile.name} spans {profile.nodes} nodes: start the Ray head here "
                "with --ray-head, or set RAY_ADDRESS to a running cluster"
            )
        return None
    node = RayNode(
        port=args.ray_port,
        node_ip=args.ray_node_ip,
        num_cpus=args.ray_num_cpus,
        num_gpus=args.ray_num_gpus,
        temp_dir=Path(args.ray_temp_dir) if args.ray_temp_dir else None,
        port_block=args.ray_port_block,
    )
    return RayNodeProcess(node, log_path=logs_dir() / f"ray-head-{profile.name}.log")


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


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def install_stop_handlers(on_signal: Callable[[str], None] | None = None) -> None:
    """SIGTERM, SIGINT and SIGHUP (a closed terminal, a dropped ssh session) all unwind as
    KeyboardInterrupt, so `finally` stops the children in order; the first one only: a
    second signal (a supervisor's group kill, an impatient Ctrl-C) must not interrupt that
    shutdown half way and leave vLLM behind. `on_signal` gets the first one's name."""

    def handler(signum: int, frame: FrameType | None) -> None:
        hold_stop_signals()
        name = signal.Signals(signum).name
        print(f"\n{name} received", file=sys.stderr)
        if on_signal is not None:
            on_signal(name)
        raise KeyboardInterrupt

    for stop in STOP_SIGNALS:
        signal.signal(stop, handler)


def hold_stop_signals() -> None:
    """From now on a stop signal is only noted: the shutdown under way finishes (called
    first thing in the `finally` that stops the children, whatever ended the run)."""

    def stopping(signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        print(f"\n{name} received while stopping: still stopping", file=sys.stderr)

    for stop in STOP_SIGNALS:
        signal.signal(stop, stopping)


def run(args: argparse.Namespace) -> int:
    from serving.engine.launch import build_supervisor, describe_command, serve_launcher_metrics
    from serving.engine.port_check import refuse_taken
    from serving.profiles import load_profile

    profile = load_profile(args.profile)
    if args.dry_run:
        print(describe_command(profile, host=args.host, port=args.port))
        return 0
    supervisor = build_supervisor(
        profile,
        host=args.host,
        port=args.port,
        log_file=args.log_file,
        ray_head=ray_head(args, profile),
    )
    launcher_port = metrics_port(args, args.port)
    ports = {args.port: "the engine's (--port)"}
    if launcher_port:
        ports[launcher_port] = "the launcher's (--metrics-port)"
    refuse_taken(ports, host=args.host)
    metrics = None
    if launcher_port:
        metrics = serve_launcher_metrics(supervisor, profile, host=args.host, port=launcher_port)
    install_stop_handlers(None if metrics is None else metrics.record_stop_signal)
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
        hold_stop_signals()
        supervisor.stop()
    return 0
