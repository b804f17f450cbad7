"""Real Locust runs (subprocesses) against the fake upstream, through the CLI and the runner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadtest.analysis import analyze
from loadtest.cli import main
from loadtest.prompts import Prompt, write_prompts
from loadtest.runner import LocustRun, run_locust
from loadtest.targets import Targets
from tests.loadtest.conftest import API_KEY
from tests.loadtest.fake_upstream import FakeConfig, RunningFake, serve_fake


def cli(fake: RunningFake, tokenizer_dir: Path, out: Path, *extra: str) -> int:
    return main(
        [
            "run",
            "--host",
            fake.url,
            "--api-key",
            API_KEY,
            "--tokenizer",
            str(tokenizer_dir),
            "--engine-metrics",
            f"{fake.url}/metrics",
            "--gateway-metrics",
            f"{fake.url}/metrics?source=gateway",
            "--scrape-interval",
            "0.25",
            "--out",
            str(out),
            *extra,
        ]
    )


def test_run_records_exact_token_counts_and_locust_stats(
    fake: RunningFake, tokenizer_dir: Path, tmp_path: Path
) -> None:
    code = cli(
        fake, tokenizer_dir, tmp_path, "--users", "4", "--max-requests", "24", "--duration", "60s"
    )
    assert code == 0
    report = json.loads((tmp_path / "report.json").read_text())
    summary = report["summary"]
    assert summary["succeeded"] == 24 and summary["failed"] == 0
    # Every request completed, so our token counts equal the upstream's counters.
    assert summary["output_tokens"] == fake.state.generation_tokens == 24 * 32
    assert summary["prompt_tokens"] == fake.state.prompt_tokens
    assert report["engine"]["generation_tokens"] == fake.state.generation_tokens
    # The gauge as the engine served it to the scrapes (whatever moment they landed on).
    assert report["engine"]["running_max"] == max(fake.state.running_served)
    assert report["gateway"]["gateway_requests_total"] == 24
    assert 30 <= summary["ttft"]["p50_ms"] < 1000
    assert 5 <= summary["itl"]["p50_ms"] < 200
    assert report["verdict"]["passed"] is True
    assert all(
        body["ignore_eos"] and body["stream_options"] == {"include_usage": True}
        for body in fake.state.bodies
    )
    entries = json.loads((tmp_path / "locust-stats.json").read_text())
    counts = {(e["method"], e["name"]): e["num_requests"] for e in entries}
    assert counts[("POST", "chat")] == 24 and counts[("TTFT", "chat")] == 24
    assert counts[("TPOT", "chat")] == 24 and counts[("ITL", "chat")] == 24 * 32


def test_step_ramp_with_two_locust_processes(
    fake: RunningFake, tokenizer_dir: Path, tmp_path: Path
) -> None:
    code = cli(fake, tokenizer_dir, tmp_path, "--step-ramp", "1,2,2s,2", "--processes", "2")
    assert code == 0
    assert len(list((tmp_path / "records").glob("records-*.jsonl"))) == 2  # one per worker
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["summary"]["succeeded"] > 4
    assert report["engine"]["running_max"] == max(fake.state.running_served)


def test_in_band_errors_and_bad_statuses_fail_requests_and_the_verdict(
    fake: RunningFake, tmp_path: Path
) -> None:
    def prompt(text: str) -> Prompt:
        return Prompt("chat", text, 10, 8, ignore_eos=True, temperature=0.0)

    prompts = tmp_path / "prompts.jsonl"
    write_prompts(
        [prompt("hello there"), prompt("FAIL_INBAND now"), prompt("FAIL_STATUS")], prompts
    )
    data = run_locust(
        LocustRun(
            host=fake.url,
            model="qwen3-tiny",
            prompts_path=prompts,
            out=tmp_path,
            users=1,
            api_key=API_KEY,
            max_requests=6,
            ordered=True,
        )
    )
    errors = sorted({r.error or "" for r in data.records if not r.ok})
    assert len(data.records) == 6 and sum(r.ok for r in data.records) == 2
    assert errors[0].startswith("HTTP 500") and errors[1] == "SSE error event: engine died"
    report = analyze(data, Targets(max_error_rate=0.01), meta={})
    assert not report.verdict.passed


def test_wrong_key_is_a_failed_run_with_exit_code_1(
    fake: RunningFake, tokenizer_dir: Path, tmp_path: Path
) -> None:
    code = main(
        [
            "run",
            "--host",
            fake.url,
            "--api-key",
            "sk-wrong",
            "--tokenizer",
            str(tokenizer_dir),
            "--users",
            "1",
            "--max-requests",
            "2",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 1
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["summary"]["failed"] == 2
    assert next(iter(report["summary"]["errors"])).startswith("HTTP 401")


def test_two_tenants_each_send_with_their_own_key(
    tokenizer_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    quiet_key, noisy_key = "sk-quiet-tenant", "sk-noisy-tenant"
    workload = tmp_path / "tenants.yaml"
    workload.write_text(
        "num_prompts: 40\nscenarios:\n"
        "  - {name: quiet-chat, tenant: quiet, weight: 1, prompt_tokens: [16, 32],"
        " output_tokens: 4}\n"
        "  - {name: noisy-long, tenant: noisy, weight: 3, prompt_tokens: [16, 32],"
        " output_tokens: 8, bursts: [0.5, 0.5]}\n"
    )
    config = FakeConfig(ttft_s=0.01, itl_s=0.002, api_key=quiet_key, other_keys=(noisy_key,))
    with serve_fake(config) as fake:
        argv = ["run", "--host", fake.url, "--tokenizer", str(tokenizer_dir),
                "--workload", str(workload), "--users", "4", "--duration", "3s",
                "--engine-metrics", f"{fake.url}/metrics",
                "--out", str(tmp_path / "out")]  # fmt: skip
        assert main(argv) == 2  # a tenant without its key: refused before Locust starts
        monkeypatch.setenv("LOADTEST_API_KEY_QUIET", quiet_key)
        monkeypatch.setenv("LOADTEST_API_KEY_NOISY", noisy_key)
        assert main(argv) == 0
        seen = dict(fake.state.keys)
    assert set(seen) == {quiet_key, noisy_key}
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["summary"]["failed"] == 0
    # 4 users by share 1:3: one quiet user, three noisy ones (sending half of the time)
    bodies = {body["max_tokens"] for body in fake.state.bodies}
    assert bodies == {4, 8}
