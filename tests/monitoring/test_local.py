"""`make monitor` (monitoring.prometheus.local): the config it writes and the Prometheus it
starts, for real (Debian's binary; the stack itself need not run)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from monitoring.prometheus.local import render_config, stack_targets
from monitoring.prometheus.ruleset import load_rules, rule_files
from monitoring.prometheus.series import JOBS
from tests.monitoring.promtool import run_promtool
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]


def test_the_written_config_scrapes_the_given_ports_and_passes_promtool(
    promtool: Path, tmp_path: Path
) -> None:
    config = tmp_path / "prometheus.yml"
    config.write_text(render_config(stack_targets(9000, 9001, 9002)), encoding="utf-8")
    data = yaml.safe_load(config.read_text(encoding="utf-8"))
    scraped = {
        job["job_name"]: job["static_configs"][0]["targets"] for job in data["scrape_configs"]
    }
    assert scraped == {
        "gateway": ["127.0.0.1:9000"],
        "vllm": ["127.0.0.1:9001"],
        "engine-launcher": ["127.0.0.1:9002"],
    }
    assert data["rule_files"] == [str(path.resolve()) for path in rule_files()]
    result = run_promtool(promtool, "check", "config", config)
    assert result.returncode == 0, result.stdout + result.stderr


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


def test_make_monitor_starts_prometheus_with_the_rules_and_the_three_jobs(
    promtool: Path, tmp_path: Path
) -> None:
    if shutil.which("prometheus") is None:
        pytest.fail("prometheus not found: `make system-deps` installs Debian's package")
    prom_port = free_port()
    env = {**os.environ, "SERVING_HOME": str(tmp_path)}
    command = [
        sys.executable, "-m", "monitoring.prometheus.local",
        "--gateway-metrics-port", str(free_port()), "--engine-port", str(free_port()),
        "--prom-port", str(prom_port),
    ]  # fmt: skip
    process = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    base = f"http://127.0.0.1:{prom_port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, process.communicate()[0]
            try:
                with urllib.request.urlopen(f"{base}/-/ready", timeout=2) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            assert time.monotonic() < deadline, "Prometheus did not become ready in 60 s"
            time.sleep(0.2)
        rules = get_json(f"{base}/api/v1/rules")["data"]["groups"]
        loaded = {rule["name"] for group in rules for rule in group["rules"]}
        assert loaded == {rule.name for rule in load_rules()}
        jobs: list[str] = []
        while time.monotonic() < deadline and len(jobs) < len(JOBS):  # discovery is async
            targets = get_json(f"{base}/api/v1/targets")["data"]["activeTargets"]
            jobs = sorted(target["labels"]["job"] for target in targets)
            time.sleep(0.2)
        assert jobs == sorted(JOBS)
        assert (tmp_path / "prometheus" / "data").is_dir()
    finally:
        process.terminate()
        output, _ = process.communicate(timeout=30)
    assert f"Prometheus: {base}" in output
    assert f"Prometheus data source with URL {base}" in output
    assert f"SERVING_PROMETHEUS_URL={base}" in output
