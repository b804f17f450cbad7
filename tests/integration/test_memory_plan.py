"""The load test proves the memory plan: vLLM's KV cache fills where the planner says.

One engine with `cpu-tiny-smallkv` (a 10 MiB KV cache: 10 blocks of 512 tokens, eager mode)
serves `python -m loadtest memory`, which ramps 1..6 closed-loop users of up to 1,016-token
sequences (2 blocks each, both held from admission). The planner predicts 4 running at once
(9 usable blocks // 2: vLLM keeps one as its null block), the 5th waiting, and the cache 8/9
full from then on. The mode moves from step to step on conditions it sees in vLLM's /metrics
(all of a step's requests in the engine, then twice as many finished as there are users) and
judges waiting by the median of a step's scrapes, so a stalled process on this 2-core
machine cannot decide the result. Ten scrapes a step at least, rather than `make
loadtest-memory`'s twenty: a step lasted as long as its scrapes (17-23 s for twenty, while
vLLM finished 13-42 requests, far more than the two turnovers ask), and what is held here
(where waiting starts, the plateau, the blocks per sequence) needs the waiting steps' medians
and maxima, which ten scrapes give.

Tolerances: the issue's. Waiting starts within one user of the plan; the plateau (the
highest KV usage while requests wait) within 5% of it, and no reading of the ramp above it.
Not held: the *median* KV usage of each step. vLLM updates its gauges once per engine step,
after it, and on this CPU the step that prefills a newly admitted prompt is much longer than
a decode step, so the gauges show the state before an admission (one sequence fewer) for a
good part of the time: medians sat a sequence below the plan at 5 or 6 users in two of
three runs. Measured (docs/load-testing.md): waiting from 5 users, plateau 88.9% = the plan,
0 preempted.
"""

from __future__ import annotations

import json
from pathlib import Path

from loadtest.cli import main
from loadtest.memory_plan import predict
from serving.models.tiny_model import ensure_tiny_model
from tests.integration.conftest import engine_process
from tests.ports import free_port

PROFILE = "cpu-tiny-smallkv"


def test_kv_cache_fills_where_the_planner_says(tmp_path: Path) -> None:
    prediction = predict(PROFILE)
    assert (prediction.sequences, prediction.waiting_from) == (4, 5)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with engine_process(PROFILE, port):
        code = main([
            "memory", "--profile", PROFILE, "--host", url, "--engine-metrics", f"{url}/metrics",
            "--tokenizer", str(ensure_tiny_model()), "--out", str(tmp_path),
            "--min-scrapes", "10",
        ])  # fmt: skip
    report = json.loads((tmp_path / "report.json").read_text())
    measured, steps = report["measured"], report["steps"]
    assert report["engine_blocks"] == prediction.num_blocks == 10
    assert measured["failed"] == 0 and all(s["requests"] > 0 for s in steps)
    # Within one sequence of the plan: requests wait (or are preempted) from 5 users on.
    assert measured["saturated_from"] is not None
    assert abs(measured["saturated_from"] - prediction.waiting_from) <= 1, steps
    # The cache tops out within 5% of the plan's 8/9 while requests wait, and no reading of
    # the ramp goes beyond that (the gauges' medians are not held: see loadtest/memory.py).
    expected = prediction.plateau_usage
    plateau, highest = measured["plateau_usage"], measured["usage_max"]
    assert plateau is not None and abs(plateau - expected) <= 0.05 * expected, steps
    assert highest <= expected * 1.05, steps
    # Every running sequence holds the planned 2 blocks, at every step.
    for s in steps:
        assert abs(s["blocks_per_sequence"] - 2) <= 0.05 * 2, s
        if s["users"] < prediction.waiting_from - 1:
            assert s["waiting"] == 0, s  # below the plan's limit nothing waits
    assert all(s["engine_tokens_per_s"] and s["client_tokens_per_s"] > 0 for s in steps)
    assert code == 0, report["verdict"]
    html = (tmp_path / "report.html").read_text()
    assert 'id="plan"' in html and 'id="steps"' in html and html.count("<svg") == 4
