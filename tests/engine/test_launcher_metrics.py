"""The launcher's metrics endpoint: load stats per start, restarts counted, port errors named."""

from __future__ import annotations

import socket
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from serving.engine.launch import serve_launcher_metrics
from serving.engine.launcher_metrics import LauncherMetrics
from serving.engine.load_stats import LoadStats
from serving.engine.process import EngineProcess, Stopped
from serving.engine.supervisor import RestartPolicy, Supervisor
from serving.errors import ServingError
from serving.profiles import load_profile
from serving.vllm_flags import EngineCommand
from tests.engine.test_supervisor import FAKE
from tests.ports import free_port


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("serving_engine_")
        and sample.labels == {"profile": "cpu-tiny", "model": "qwen3-tiny"}
    }


def test_each_start_is_exported_and_restarts_are_counted() -> None:
    metrics = LauncherMetrics("cpu-tiny", "qwen3-tiny")
    port = free_port()
    metrics.serve("127.0.0.1", port)
    assert scrape(port)["serving_engine_restarts_total"] == 0
    metrics.record_start(LoadStats(40.0, 30.0, 0.02, 2 * 2**30), restart=False)
    metrics.record_start(LoadStats(41.0, None, None, 2**30), restart=True)
    values = scrape(port)
    assert values["serving_engine_startup_seconds"] == 41.0
    assert values["serving_engine_model_load_seconds"] == 30.0  # unknown: the last known stays
    assert values["serving_engine_load_peak_memory_bytes"] == 2**30
    assert values["serving_engine_restarts_total"] == 1


def test_the_stop_signal_and_how_each_stop_went_are_exported() -> None:
    metrics = LauncherMetrics("cpu-tiny", "qwen3-tiny")
    port = free_port()
    metrics.serve("127.0.0.1", port)
    before = scrape_all(port)
    assert before[("serving_engine_stops_total", "false")] == 0
    assert before[("serving_engine_stops_total", "true")] == 0  # exported from the start
    assert not any(name == "serving_launcher_stop_signal_info" for name, _ in before)
    metrics.record_stop_signal("SIGHUP")
    metrics.record_stop(Stopped(killed=False, seconds=2.0))
    metrics.record_stop(Stopped(killed=True, seconds=21.0))
    metrics.record_stop(Stopped(killed=True, seconds=20.5))
    after = scrape_all(port)
    assert after[("serving_launcher_stop_signal_info", "SIGHUP")] == 1
    assert after[("serving_engine_stops_total", "false")] == 1
    assert after[("serving_engine_stops_total", "true")] == 2


def scrape_all(port: int) -> dict[tuple[str, str], float]:
    """Every serving_* sample of the profile, by name and its one other label's value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = dict(sample.labels)
            assert labels.pop("profile") == "cpu-tiny" and labels.pop("model") == "qwen3-tiny"
            found[sample.name, "".join(labels.values())] = sample.value
    return found


def test_a_busy_port_is_one_clear_error() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ServingError, match=f"--metrics-port {port}: cannot listen"):
            LauncherMetrics("cpu-tiny", "qwen3-tiny").serve("127.0.0.1", port)


def test_supervisor_records_the_first_start_and_each_restart(tmp_path: Path) -> None:
    engine_port, metrics_port = free_port(), free_port()

    def make_process() -> EngineProcess:
        argv = [sys.executable, FAKE, str(engine_port), "--worker", "--load-mib", "20",
                "--die-after", "4"]  # fmt: skip
        return EngineProcess(
            EngineCommand(argv=argv), f"http://127.0.0.1:{engine_port}", tmp_path / "engine.log"
        )

    supervisor = Supervisor(
        make_process, RestartPolicy(initial_backoff_s=0.1), on_event=lambda _: None
    )
    serve_launcher_metrics(
        supervisor, load_profile("cpu-tiny"), host="127.0.0.1", port=metrics_port
    )
    supervisor.start()
    first = scrape(metrics_port)
    assert first["serving_engine_restarts_total"] == 0
    assert first["serving_engine_weights_load_seconds"] == 0.25
    assert first["serving_engine_load_peak_memory_bytes"] > 20 * 2**20
    watcher = threading.Thread(target=supervisor.watch, kwargs={"poll_s": 0.1}, daemon=True)
    watcher.start()
    deadline = time.monotonic() + 30
    while scrape(metrics_port)["serving_engine_restarts_total"] < 1:
        assert time.monotonic() < deadline, "no restart recorded"
        time.sleep(0.2)
    supervisor.stop()
    watcher.join(timeout=30)
