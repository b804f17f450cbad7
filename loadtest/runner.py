"""Run Locust headless as a subprocess while scraping /metrics and watching its CPU.

Locust runs in its own process(es): its import monkey-patches the standard library with
gevent, which must not happen to the runner (threads for the scraper and CPU monitor,
vLLM's benchmark client in the cross-check). `--processes N` forks N Locust workers under
a master when the machine has the cores to spare.

Usage: `data = run_locust(LocustRun(host=..., users=4, duration_s=10, out=dir), ...)`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from loadtest.config import (
    API_KEY_ENV,
    CONFIG_ENV,
    StepRamp,
    Tenancy,
    UserConfig,
    write_user_config,
)
from loadtest.cpu import CpuMonitor, CpuSummary
from loadtest.errors import LoadTestError
from loadtest.records import RequestRecord, read_records
from loadtest.scraper import MetricsScraper, Scrape, ScrapeFailures

LOCUSTFILE = Path(__file__).with_name("locustfile.py")
# Seconds Locust may take beyond the run's duration to start and stop before it is killed.
GRACE_S = 120.0


def default_processes() -> int:
    """Locust worker processes: one per 4 cores, none (a single process) on small machines."""
    cores = os.cpu_count() or 1
    return cores // 4 if cores >= 8 else 1


@dataclass(frozen=True, kw_only=True)
class LocustRun:
    host: str
    model: str
    prompts_path: Path
    out: Path
    users: int = 1
    # Users started per second; None: all of them within one second, spread evenly. The
    # cross-check starts them all at once, as vLLM's client starts its first N requests.
    spawn_rate: float | None = None
    duration_s: float = 10.0
    step_ramp: StepRamp | None = None
    processes: int = 1
    api_key: str | None = None
    metrics: dict[str, str] | None = None  # source -> /metrics URL
    scrape_interval_s: float = 1.0
    itl_events: bool = True
    max_requests: int | None = None  # stop after this many (one process only)
    ordered: bool = False  # send prompts in file order (the cross-check), not from a random place
    # Users from this file (loadtest.config.write_users), changed by a driver while Locust
    # runs; `duration_s` is then only the longest the run may take.
    users_file: Path | None = None
    tenants: dict[str, Tenancy] = field(default_factory=dict)


# Runs beside Locust (in the calling thread) while it runs; returns once it told Locust to stop.
Driver = Callable[[MetricsScraper, "subprocess.Popen[bytes]"], None]


@dataclass(frozen=True)
class RunData:
    started: float  # wall clock
    ended: float
    exit_code: int
    records: list[RequestRecord]
    scrapes: list[Scrape]
    scrape_failures: dict[str, ScrapeFailures]
    cpu: CpuSummary
    log: Path

    @property
    def window(self) -> tuple[float, float]:
        """From the first request's start to the last one's end (the run if none finished)."""
        if not self.records:
            return self.started, self.ended
        return self.records[0].start, max(r.end for r in self.records)


def locust_command(run: LocustRun) -> list[str]:
    duration = run.step_ramp.duration_s if run.step_ramp else run.duration_s
    command = [
        sys.executable,
        "-m",
        "locust",
        "-f",
        str(LOCUSTFILE),
        "--headless",
        "--host",
        run.host.rstrip("/"),
        "--users",
        str(run.users),
        "--spawn-rate",
        str(run.spawn_rate or max(run.users, 1)),
        "--run-time",
        f"{max(1, round(duration))}s",
        "--stop-timeout",
        "0",
        "--exit-code-on-error",
        "0",
        "--only-summary",
        "--loglevel",
        "WARNING",
        # Locust's final statistics: its CSV writer only samples every second and can miss
        # the last requests; the JSON is written once, at the end.
        "--json-file",
        str(run.out / "locust-stats"),
    ]
    if run.processes > 1:
        command += ["--processes", str(run.processes)]
    return command


def run_locust(run: LocustRun, driver: Driver | None = None) -> RunData:
    if run.max_requests is not None and run.processes > 1:
        raise LoadTestError("max_requests needs a single Locust process (--processes 1)")
    run.out.mkdir(parents=True, exist_ok=True)
    records_dir = run.out / "records"
    if records_dir.exists():
        for old in records_dir.glob("records-*.jsonl"):
            old.unlink()
    config_path = run.out / "locust-config.json"
    write_user_config(
        UserConfig(
            model=run.model,
            prompts_path=str(run.prompts_path.resolve()),
            records_dir=str(records_dir.resolve()),
            itl_events=run.itl_events,
            step_ramp=run.step_ramp,
            max_requests=run.max_requests,
            ordered=run.ordered,
            users_file=str(run.users_file.resolve()) if run.users_file else None,
            tenants=run.tenants,
        ),
        config_path,
    )
    env = dict(os.environ, **{CONFIG_ENV: str(config_path.resolve())}, PYTHONUNBUFFERED="1")
    env.pop(API_KEY_ENV, None)
    if run.api_key:
        env[API_KEY_ENV] = run.api_key
    headers = {"Authorization": f"Bearer {run.api_key}"} if run.api_key else {}
    scraper = MetricsScraper(run.metrics or {}, interval_s=run.scrape_interval_s, headers=headers)
    log = run.out / "locust.log"
    duration = run.step_ramp.duration_s if run.step_ramp else run.duration_s
    started = time.time()
    with log.open("w") as sink:
        process = subprocess.Popen(
            locust_command(run), env=env, stdout=sink, stderr=subprocess.STDOUT
        )
        with scraper, CpuMonitor(process.pid, interval_s=run.scrape_interval_s) as cpu:
            try:
                if driver is not None:
                    driver(scraper, process)
                    duration = 0.0  # the driver saw it through: Locust only stops now
                code = process.wait(timeout=duration + GRACE_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                raise LoadTestError(
                    f"Locust did not finish in {duration + GRACE_S:.0f}s; see {log}"
                ) from None
            except BaseException:
                process.kill()
                process.wait()
                raise
    ended = time.time()
    records = read_records(records_dir)
    if code != 0 and not records:
        tail = log.read_text(errors="replace")[-2000:]
        raise LoadTestError(f"Locust exited with {code} and recorded nothing:\n{tail}")
    data = RunData(
        started, ended, code, records, scraper.samples, scraper.failures, cpu.summary(), log
    )
    return RunData(
        started,
        ended,
        code,
        records,
        scraper.samples,
        scraper.failures,
        cpu.summary(data.window),
        log,
    )
