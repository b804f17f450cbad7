"""Every series the rules read is exported under that name by the code that owns it: the
gateway's and the launcher's /metrics rendered here, vLLM's metric declarations read from
its installed source (a vLLM upgrade that renames one fails here, before any dashboard)."""

from __future__ import annotations

from monitoring.exported import gateway_names, launcher_names, vllm_declarations
from monitoring.prometheus.series import ENGINE, GATEWAY, LAUNCHER, REMOVED_VLLM, SCRAPED


def listed(job: str) -> set[str]:
    return {series.name for series in SCRAPED if series.job == job}


def test_the_gateway_exports_every_series_the_rules_read() -> None:
    assert listed(GATEWAY) - gateway_names() == set()


def test_the_launcher_exports_every_series_the_rules_read() -> None:
    assert listed(LAUNCHER) - launcher_names() == set()


def test_vllm_declares_every_series_the_rules_read_with_its_type() -> None:
    declared = vllm_declarations()
    for series in SCRAPED:
        if series.job == ENGINE:
            assert declared.get(series.family) == series.type, series.family


def test_the_metrics_listed_as_removed_are_gone_from_vllm() -> None:
    declared = vllm_declarations()
    assert {name.removesuffix("_total") for name in REMOVED_VLLM} & set(declared) == set()


def test_the_offline_names_hold_what_the_exporters_are_known_to_export() -> None:
    assert {"gateway_requests_total", "gateway_upstream_errors_total"} <= gateway_names()
    assert "serving_engine_restarts_total" in launcher_names()
    assert vllm_declarations()["vllm:time_to_first_token_seconds"] == "histogram"
    assert vllm_declarations()["vllm:cache_config_info"] == "gauge"
