"""`make monitor`: Debian's Prometheus scraping the local stack, in the foreground.

    .venv/bin/python -m monitoring.prometheus.local [--gateway-metrics-port 8100]
        [--engine-port 8001] [--metrics-port PORT] [--prom-port 9090]

Writes <serving home>/prometheus/prometheus.yml: prometheus.yml with the targets moved to the
stack's ports (the gateway's metrics port, where its per-key series are, vLLM's port and the
launcher's, engine port + 1 unless --metrics-port says otherwise, as `serving up` decides them)
and the rule files as absolute paths. Keeps the TSDB in <serving home>/prometheus/data
(./var/prometheus in a checkout), prints the URL and how to point a Grafana at it, then becomes
`prometheus` (exec) until Ctrl-C. The stack itself is `make up`, in another terminal.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from monitoring.prometheus import CONFIG, HERE, PROMETHEUS_PORT
from monitoring.prometheus.ruleset import rule_files
from monitoring.prometheus.series import ENGINE, GATEWAY, LAUNCHER
from serving.engine.command import DEFAULT_ENGINE_PORT, add_metrics_port_argument, metrics_port
from serving.errors import ServingError
from serving.paths import serving_home
from serving.ports import GATEWAY_METRICS_PORT

GRAFANA = HERE.parent / "grafana"


def render_config(targets: dict[str, str], config: Path = CONFIG) -> str:
    """`config` with each job's static targets replaced by `targets[job]` and the rule
    files made absolute, so the copy works from any directory."""
    data: dict[str, Any] = yaml.safe_load(config.read_text(encoding="utf-8"))
    data["rule_files"] = [str(path.resolve()) for path in rule_files(config)]
    for job in data.get("scrape_configs", []):
        name = job["job_name"]
        if name in targets:
            job["static_configs"] = [{"targets": [targets[name]]}]
    header = f"# Written by `make monitor` from {config}: edit that file, not this one.\n"
    return header + yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


def stack_targets(
    gateway_metrics_port: int, engine_port: int, launcher_port: int
) -> dict[str, str]:
    """The jobs' targets: the gateway's on its metrics port, since its API port's /metrics
    leaves out every series with a key or a model, which rules and dashboards read."""
    return {
        GATEWAY: f"127.0.0.1:{gateway_metrics_port}",
        ENGINE: f"127.0.0.1:{engine_port}",
        LAUNCHER: f"127.0.0.1:{launcher_port}",
    }


def prometheus_argv(config: Path, data_dir: Path, prom_port: int) -> list[str]:
    return [
        "prometheus",
        f"--config.file={config}",
        f"--storage.tsdb.path={data_dir}",
        f"--web.listen-address=127.0.0.1:{prom_port}",
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m monitoring.prometheus.local",
        description="Prometheus for the local stack (make monitor)",
    )
    parser.add_argument(
        "--gateway-metrics-port",
        type=int,
        default=GATEWAY_METRICS_PORT,
        help="the gateway's metrics port (`serving up --gateway-metrics-port`)",
    )
    parser.add_argument("--engine-port", type=int, default=DEFAULT_ENGINE_PORT)
    add_metrics_port_argument(parser)
    parser.add_argument("--prom-port", type=int, default=PROMETHEUS_PORT)
    args = parser.parse_args(argv)
    try:
        launcher_port = metrics_port(args, args.engine_port)
        binary = shutil.which("prometheus")
        if binary is None:
            raise ServingError(
                "prometheus is not installed: `make system-deps` installs Debian's package"
            )
    except ServingError as exc:
        print(f"make monitor: error: {exc}", file=sys.stderr)
        return 2

    home = serving_home() / "prometheus"
    data_dir = home / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    config = home / "prometheus.yml"
    targets = stack_targets(args.gateway_metrics_port, args.engine_port, launcher_port)
    config.write_text(render_config(targets), encoding="utf-8")

    url = f"http://127.0.0.1:{args.prom_port}"
    scraped = ", ".join(f"{job} {target}" for job, target in targets.items())
    print(
        f"Prometheus: {url}   (alerts: {url}/alerts, rules: {url}/rules, targets: {url}/targets)\n"
        f"  scraping {scraped}; start the stack with `make up` in another terminal.\n"
        f"  config {config}, data {data_dir}\n"
        f"Grafana: add a Prometheus data source with URL {url}, or provision it and the\n"
        f"  dashboards: GF_PATHS_PROVISIONING={GRAFANA / 'provisioning'}\n"
        f"  SERVING_PROMETHEUS_URL={url} SERVING_GRAFANA_DASHBOARDS={GRAFANA / 'dashboards'}\n"
        "Ctrl-C stops Prometheus.",
        flush=True,
    )
    os.execv(binary, prometheus_argv(config, data_dir, args.prom_port))


if __name__ == "__main__":
    sys.exit(main())
