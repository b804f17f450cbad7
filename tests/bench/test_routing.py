"""The routing benchmark runs end to end and its results file holds sane numbers.

The overhead part (`--quick`, fast upstreams, every default path) always runs; the prefix
cache part starts two real engines and is marked `engine`. Speed is not asserted: that
is what the benchmark reports. What routing must do is: round-robin splits requests evenly,
one engine alone sees everything, and affinity finds more of the prefix cache than
round-robin does.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.results_files import latest
from bench.routing.overhead import DEFAULT_PATHS
from bench.routing.prefix_cache import CACHE_PATHS
from bench.routing.workload import Shape, conversations

REPO = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, *args: str, timeout: float) -> dict[str, Any]:
    command = [sys.executable, "-m", "bench.routing", "--quick", "--output-dir", str(tmp_path)]
    done = subprocess.run(
        [*command, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stderr[-3000:]
    doc: dict[str, Any] = json.loads(latest(tmp_path / "routing", ".json").read_text())
    assert latest(tmp_path / "routing").read_text().startswith("# Routing across vLLM replicas")
    return doc


def test_quick_overhead_writes_every_path(tmp_path: Path) -> None:
    doc = _run(tmp_path, "--parts", "overhead", timeout=240)
    assert "prefix_cache" not in doc
    part = doc["overhead"]
    assert part["skipped"] == {}
    assert set(part["paths"]) == {"direct", *DEFAULT_PATHS}
    for name, path in part["paths"].items():
        s = path["summary"]
        assert s["errors"] == 0, path["runs"]
        assert 0 < s["p50_ms"] <= s["p99_ms"] < 1000
        assert s["req_per_s"] > 0 and s["streams_per_s"] > 0
        if name == "direct":
            continue
        assert s["proxy_cpu_us_per_req"] > 0 and s["proxy_cpu_us_per_stream"] > 0
        # both are written to 4 decimals: at tens of us a request, more than approx's 1e-6
        assert s["proxy_req_per_s_per_core"] == pytest.approx(
            1e6 / s["proxy_cpu_us_per_req"], rel=1e-5
        )
        assert math.isfinite(part["ratios"][name]["added_p50_ms"])
    # The stack: both processes measured apart, and together as its proxy CPU.
    stack = part["paths"]["gw-router"]
    assert stack["processes"] == ["gateway", "router"]
    s = stack["summary"]
    assert s["gateway_cpu_us_per_req"] > 0 and s["router_cpu_us_per_req"] > 0
    together = s["gateway_cpu_us_per_req"] + s["router_cpu_us_per_req"]
    # Medians of sums and sums of medians differ a little.
    assert s["proxy_cpu_us_per_req"] == pytest.approx(together, rel=0.25)
    assert part["ratios"]["gw-affinity"]["req_per_s_vs_gw_router"] > 0
    text = latest(tmp_path / "routing").read_text()
    assert "| our gateway -> vllm-router (cache_aware) |" in text
    assert "vs our gateway -> vllm-router:" in text


def test_workload_is_deterministic_and_salted() -> None:
    shape = Shape(conversations=3, turns=4)
    first, again = conversations(shape, salt="a"), conversations(shape, salt="a")
    assert first == again
    other = conversations(shape, salt="b")
    assert first[0].system != other[0].system and first[0].users == other[0].users
    messages = first[1].messages(2)
    assert [m["role"] for m in messages] == ["system", *["user", "assistant"] * 2, "user"]
    assert messages[-1]["content"] == first[1].users[2]
    assert len({c.session for c in first}) == 3


@pytest.mark.engine
@pytest.mark.timeout(600)
def test_quick_prefix_cache_on_two_engines(tmp_path: Path) -> None:
    doc = _run(tmp_path, "--parts", "cache", timeout=540)
    part = doc["prefix_cache"]
    assert part["skipped"] == {}
    assert part["cache_config"]["enable_prefix_caching"] == "True"
    assert set(part["paths"]) == set(CACHE_PATHS)
    requests = part["workload"]["requests"]
    for path in part["paths"].values():
        assert path["errors"] == 0, path["first_error"]
        assert path["requests_ok"] == requests
        assert 0 <= path["hit_rate"] <= 1
        assert sum(e["requests"] for e in path["per_engine"].values()) == requests
        # Every prompt token a client was told about was counted by vLLM, and no more.
        assert path["client_prompt_tokens"] == path["engine_prompt_tokens"]
    paths = part["paths"]
    assert paths["direct"]["busiest_engine_share"] == 1.0
    assert paths["gw-rr"]["busiest_engine_share"] == 0.5
    assert paths["router-rr"]["busiest_engine_share"] == 0.5
    assert paths["gw-affinity"]["hit_rate"] > paths["gw-rr"]["hit_rate"]
    # vllm-router's cache_aware matches token ids; chat requests carry none.
    assert paths["router-ca"]["router_prefix_decisions"].get("missing_tokens") == requests
