"""Build the supervised engine for a profile: resolve the model and its LoRA adapters, render
flags, pick a log."""

from __future__ import annotations

import shlex
from pathlib import Path

from serving.engine.launcher_metrics import LauncherMetrics
from serving.engine.preflight import preflight
from serving.engine.process import EngineProcess, stderr_progress
from serving.engine.ray_cluster import RayNodeProcess
from serving.engine.resolve import resolve_adapters, resolve_model
from serving.engine.supervisor import RestartPolicy, Supervisor
from serving.paths import logs_dir
from serving.profiles.model import Profile
from serving.vllm_flags import EngineCommand, render

RAY_START_TIMEOUT_S = 120.0


def describe_command(profile: Profile, *, host: str, port: int) -> str:
    command = render(profile, profile.model, host=host, port=port)
    env = " ".join(f"{key}={shlex.quote(value)}" for key, value in sorted(command.env.items()))
    return f"{env} {shlex.join(command.argv)}".strip()


def build_supervisor(
    profile: Profile,
    *,
    host: str,
    port: int,
    log_file: str | None = None,
    policy: RestartPolicy | None = None,
    ray_head: RayNodeProcess | None = None,
) -> Supervisor:
    """`ray_head`: a Ray cluster head this launcher runs for vLLM (`serving engine --ray-head`):
    started before vLLM and again before a restart if it died, stopped after vLLM."""
    model_path = resolve_model(profile)
    adapters = resolve_adapters(profile)
    preflight(profile, model_path, adapters=adapters)
    command = render(profile, model_path, host=host, port=port, adapter_paths=adapters)
    if ray_head is not None:
        ray_env = {"RAY_ADDRESS": ray_head.node.cluster_address()}
        command = EngineCommand(argv=command.argv, env={**command.env, **ray_env})
    log_path = Path(log_file) if log_file else logs_dir() / f"engine-{profile.name}.log"
    policy = policy or RestartPolicy()

    def make_process() -> EngineProcess:
        if ray_head is not None:
            ray_head.ensure_running(RAY_START_TIMEOUT_S)
        return EngineProcess(
            command=command,
            base_url=f"http://{host}:{port}",
            log_path=log_path,
            ranks=profile.tensor_parallel_size * profile.pipeline_parallel_size,
            engine_core_on_workers=profile.device == "cpu",
        )

    return Supervisor(
        make_process=make_process,
        policy=policy,
        progress=stderr_progress,
        on_stop=None if ray_head is None else ray_head.stop,
    )


def serve_launcher_metrics(
    supervisor: Supervisor, profile: Profile, *, host: str, port: int
) -> LauncherMetrics:
    """Export each (re)start's load time and memory, and how the server stopped, on
    http://host:port/metrics."""
    metrics = LauncherMetrics(profile.name, profile.served_model_name)
    metrics.serve(host, port)

    def record(process: EngineProcess, restart: bool) -> None:
        if process.load_stats is not None:
            metrics.record_start(process.load_stats, restart=restart)

    supervisor.on_started = record
    supervisor.on_stopped = metrics.record_stop
    return metrics
