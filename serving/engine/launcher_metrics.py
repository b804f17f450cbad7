"""The launcher's own Prometheus metrics: how vLLM's (re)starts and its stop went.

vLLM's /metrics describe a running engine; what happened before it answered (how long the
model took to load, how much host memory loading needed, how often it was restarted) and how
its stop went (the signal the launcher got, as the stack starts draining; whether vLLM's
processes all ended on SIGTERM within the grace period or had to be killed) only the launcher
saw. `serving engine` and `serving up` serve these on --metrics-port (default: the
engine port + 1), bound to the engine's address, in a registry of their own.

Usage: `metrics = LauncherMetrics("cpu-tiny", "qwen3-tiny"); metrics.serve("127.0.0.1", 8002)`
and `metrics.record_start(stats, restart=False)` after each healthy start,
`metrics.record_stop_signal("SIGTERM")` and `metrics.record_stop(stopped)` as it stops.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from serving.engine.load_stats import LoadStats
from serving.engine.process import Stopped
from serving.errors import ServingError


class LauncherMetrics:
    def __init__(self, profile: str, model: str) -> None:
        self.registry = CollectorRegistry()
        labels = {"profile": profile, "model": model}

        def gauge(name: str, documentation: str) -> Gauge:
            metric = Gauge(name, documentation, list(labels), registry=self.registry)
            return metric.labels(**labels)

        self._startup = gauge(
            "serving_engine_startup_seconds", "Seconds from spawning vLLM to /health answering"
        )
        self._load = gauge(
            "serving_engine_model_load_seconds",
            "Seconds from spawning vLLM to every rank having loaded its weights",
        )
        self._weights = gauge(
            "serving_engine_weights_load_seconds",
            "vLLM's own 'Loading weights took' for the slowest rank",
        )
        self._peak = gauge(
            "serving_engine_load_peak_memory_bytes",
            "Peak summed PSS of vLLM's processes while loading the model (host memory)",
        )
        restarts = Counter(
            "serving_engine_restarts", "Times the supervisor restarted vLLM", list(labels),
            registry=self.registry,
        )  # fmt: skip
        self._restarts = restarts.labels(**labels)
        self._restarts.inc(0)  # exported as 0 from the start, not absent
        self._stop_signal = Gauge(
            "serving_launcher_stop_signal_info",
            "1 for the signal the launcher got: its shutdown (gateway drain, then vLLM) is on",
            [*labels, "signal"], registry=self.registry,
        )  # fmt: skip
        self._labels = labels
        stops = Counter(
            "serving_engine_stops",
            "vLLM stops by the launcher; forced=true: SIGTERM left a process of vLLM's group "
            "running after the grace period and SIGKILL ended it",
            [*labels, "forced"], registry=self.registry,
        )  # fmt: skip
        self._stops = {forced: stops.labels(**labels, forced=str(forced).lower())
                       for forced in (False, True)}  # fmt: skip
        for counter in self._stops.values():
            counter.inc(0)

    def record_start(self, stats: LoadStats, *, restart: bool) -> None:
        self._startup.set(stats.startup_seconds)
        if stats.load_seconds is not None:
            self._load.set(stats.load_seconds)
        if stats.weights_seconds is not None:
            self._weights.set(stats.weights_seconds)
        self._peak.set(stats.peak_memory_bytes)
        if restart:
            self._restarts.inc()

    def record_stop_signal(self, name: str) -> None:
        self._stop_signal.labels(**self._labels, signal=name).set(1)

    def record_stop(self, stopped: Stopped) -> None:
        self._stops[stopped.killed].inc()

    def serve(self, host: str, port: int) -> None:
        """Serve /metrics from a daemon thread for the life of the process."""
        try:
            start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise ServingError(
                f"--metrics-port {port}: cannot listen on {host} ({exc.strerror})"
            ) from exc
