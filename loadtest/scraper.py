"""Scrape vLLM's and the gateway's Prometheus /metrics on an interval while a test runs.

A background thread fetches each target every `interval_s` and keeps, per scrape, the
series named in ENGINE_SERIES (summed over label sets, or the max for KV cache usage: with
several engines the fullest cache is what runs out first) and every `gateway_*` counter and
gauge summed over labels. A target that fails is recorded as a failed scrape, never fatal.

Usage: `with MetricsScraper({"engine": url}, interval_s=1) as s: ...; s.samples`.
"""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType

from prometheus_client.parser import text_string_to_metric_families

KV_USAGE = "vllm:kv_cache_usage_perc"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
PREEMPTIONS = "vllm:num_preemptions_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
REQUEST_SUCCESS = "vllm:request_success_total"

# sample name -> how label sets combine
ENGINE_SERIES: dict[str, Callable[[list[float]], float]] = {
    KV_USAGE: max,
    RUNNING: sum,
    WAITING: sum,
    PREEMPTIONS: sum,
    PROMPT_TOKENS: sum,
    GENERATION_TOKENS: sum,
    PREFIX_HITS: sum,
    PREFIX_QUERIES: sum,
    REQUEST_SUCCESS: sum,
}
GATEWAY_PREFIX = "gateway_"
SKIPPED_SUFFIXES = ("_bucket", "_created")


@dataclass(frozen=True)
class Scrape:
    t: float  # wall clock
    source: str
    values: dict[str, float]


@dataclass
class ScrapeFailures:
    count: int = 0
    last: str | None = None


def parse_metrics(text: str) -> dict[str, float]:
    """The wanted series of one exposition, combined over label sets."""
    found: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            wanted = name in ENGINE_SERIES or (
                name.startswith(GATEWAY_PREFIX) and not name.endswith(SKIPPED_SUFFIXES)
            )
            if wanted:
                found.setdefault(name, []).append(float(sample.value))
    return {name: ENGINE_SERIES.get(name, _total)(values) for name, values in found.items()}


def _total(values: list[float]) -> float:
    return sum(values)


def fetch(url: str, headers: dict[str, str], timeout_s: float) -> str:
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        body: bytes = response.read()
    return body.decode("utf-8", "replace")


@dataclass
class MetricsScraper:
    targets: dict[str, str]  # source name -> /metrics URL
    interval_s: float = 1.0
    headers: dict[str, str] = field(default_factory=dict)
    samples: list[Scrape] = field(default_factory=list)
    failures: dict[str, ScrapeFailures] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="metrics-scraper", daemon=True)

    def scrape_once(self) -> None:
        for source, url in self.targets.items():
            now = time.time()
            try:
                text = fetch(url, self.headers, timeout_s=max(1.0, self.interval_s))
                self.samples.append(Scrape(now, source, parse_metrics(text)))
            except (OSError, ValueError, urllib.error.URLError) as exc:
                failed = self.failures.setdefault(source, ScrapeFailures())
                failed.count += 1
                failed.last = f"{url}: {exc}"

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.scrape_once()
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop, then take one last scrape so counters include the run's last requests."""
        self._stop.set()
        self._thread.join(timeout=self.interval_s + 10)
        self.scrape_once()

    def __enter__(self) -> MetricsScraper:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def series(self, source: str, name: str) -> list[tuple[float, float]]:
        return [
            (s.t, s.values[name]) for s in self.samples if s.source == source and name in s.values
        ]
