"""Model load time and peak host memory of the real engine: shown by `serving up`, exported."""

from __future__ import annotations

import urllib.request

import psutil
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import Stack

GiB = 2**30


def test_serving_up_shows_and_exports_the_model_load(stack: Stack) -> None:
    output = stack.output.read_text()
    assert "Model load: healthy after" in output and "peak host memory while loading" in output
    assert f"engine launcher metrics: {stack.launcher_url}/metrics" in output
    with urllib.request.urlopen(f"{stack.launcher_url}/metrics", timeout=5) as response:
        text = response.read().decode()
    values = {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.labels.get("profile") == "cpu-tiny"
    }
    # vLLM's own "Loading weights took" for the 6 MB model: well under a second.
    assert 0 < values["serving_engine_weights_load_seconds"] < 5
    load = values["serving_engine_model_load_seconds"]
    assert 0 < load <= values["serving_engine_startup_seconds"]
    # API server + engine core + worker, each with torch imported: over 0.5 GiB together,
    # and less than the machine has. The 1 GiB KV cache comes after loading and is not in it.
    peak = values["serving_engine_load_peak_memory_bytes"]
    assert 0.5 * GiB < peak < psutil.virtual_memory().total, peak
    assert values["serving_engine_restarts_total"] == 0
