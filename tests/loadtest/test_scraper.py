from __future__ import annotations

import time

from loadtest.scraper import KV_USAGE, RUNNING, MetricsScraper, parse_metrics
from tests.loadtest.fake_upstream import RunningFake

EXPOSITION = """\
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0"} 0.25
vllm:kv_cache_usage_perc{engine="1"} 0.5
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0"} 2
vllm:num_requests_running{engine="1"} 3
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{engine="0"} 10
vllm:generation_tokens_created{engine="0"} 1.7e9
# TYPE gateway_request_duration_seconds histogram
gateway_request_duration_seconds_bucket{le="1"} 4
gateway_request_duration_seconds_count 4
# TYPE vllm:other gauge
vllm:other 1
"""


def test_parse_combines_label_sets_and_keeps_wanted_series() -> None:
    values = parse_metrics(EXPOSITION)
    assert values == {
        KV_USAGE: 0.5,  # max over engines
        RUNNING: 5.0,  # sum
        "vllm:generation_tokens_total": 10.0,
        "gateway_request_duration_seconds_count": 4.0,
    }


def test_scraper_samples_during_the_run_and_records_failures(fake: RunningFake) -> None:
    scraper = MetricsScraper(
        {"engine": f"{fake.url}/metrics", "gateway": "http://127.0.0.1:9/metrics"},
        interval_s=0.1,
    )
    with scraper:
        time.sleep(0.5)
    engine = scraper.series("engine", KV_USAGE)
    assert len(engine) >= 4
    assert scraper.failures["gateway"].count >= 4
    assert "127.0.0.1:9" in (scraper.failures["gateway"].last or "")
