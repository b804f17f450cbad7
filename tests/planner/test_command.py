"""`serving plan` through `serving.cli.main`: JSON for tools, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import serving.cli as cli


def _plan_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert cli.main(["plan", *argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert isinstance(data, dict)
    return data


def test_json_for_7b_tp4(capsys: pytest.CaptureFixture[str]) -> None:
    data = _plan_json(
        capsys, "--model", "Qwen2.5-7B-Instruct", "--gpu", "rtx-4090", "--gpus", "4", "--tp", "4",
        "--max-model-len", "32768",
    )  # fmt: skip
    assert data["fits"] is True
    kv = data["kv"]
    assert isinstance(kv, dict)
    assert kv["bytes_per_token_model"] == 57344
    assert kv["bytes_per_token_per_gpu"] == 14336
    assert kv["capacity_tokens"] > 1_000_000


def test_json_suggestion(capsys: pytest.CaptureFixture[str]) -> None:
    data = _plan_json(
        capsys, "--model", "Qwen2.5-7B-Instruct", "--max-model-len", "32768",
        "--gpu-memory-utilization", "0.7",
    )  # fmt: skip
    assert data["fits"] is False and data["binding"] == "kv"
    suggestion = data["suggestion"]
    assert isinstance(suggestion, dict) and suggestion["change"] == "--kv-cache-dtype fp8"


def test_table_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        cli.main(["plan", "--model", "Qwen3.5-9B", "--tp", "4", "--max-model-len", "131072"]) == 0
    )
    out = capsys.readouterr().out
    assert "linear-attention state per sequence" in out
    assert "Verdict: FITS" in out


def test_a_moe_plan_says_how_many_parameters_a_token_uses(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["plan", "--model", "Qwen/Qwen3-Coder-30B-A3B-Instruct", "--gpu", "h100-80gb"]
    assert cli.main(argv) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(
        "Qwen3-Coder-30B-A3B-Instruct (30.53 B parameters, 3.35 B active per token) on 1 x H100"
    )
    data = _plan_json(capsys, *argv[1:])
    assert (data["parameters"], data["active_parameters"]) == (30_532_122_624, 3_353_032_704)
    dense = _plan_json(capsys, "--model", "Qwen3-8B")
    assert dense["active_parameters"] == dense["parameters"]


def test_local_config_and_cpu(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = {
        "model_type": "qwen3", "head_dim": 32, "hidden_size": 128, "intermediate_size": 256,
        "max_position_embeddings": 2048, "num_attention_heads": 4, "num_hidden_layers": 2,
        "num_key_value_heads": 2, "tie_word_embeddings": True, "vocab_size": 4096,
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    data = _plan_json(capsys, "--model", str(tmp_path), "--gpu", "cpu", "--kv-space-gib", "1")
    kv = data["kv"]
    assert isinstance(kv, dict)
    page = 2 * 2 * 128 * 2 * 32 * 2  # layers x K,V x block 128 x kv heads x head_dim x bf16
    assert kv["num_blocks"] == 1024**3 // page
    assert kv["block_size"] == 128


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "Qwen2.5-7B-Instruct", "--gpu", "v100"], "--gpu: unknown GPU 'v100'"),
        (["--model", "Qwen2.5-7B-Instruct", "--tp", "8"], "--tp: 8 does not divide"),
        (["--model", "Qwen2.5-7B-Instruct", "--max-model-len", "-5"], "--max-model-len: must be"),
        (["--model", "nope"], "--model: unknown model 'nope'"),
        ([], "--model: required"),
    ],
)
def test_errors_are_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert cli.main(["plan", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"serving plan: error: {message}")


def test_runner_pooling_plans_a_profiles_model_without_its_lm_head(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def weight_bytes(*argv: str) -> object:
        per_gpu = _plan_json(capsys, *argv)["per_gpu"]
        assert isinstance(per_gpu, dict)
        return per_gpu["weight_bytes"]

    model = ["--model", "Qwen/Qwen3-Embedding-8B", "--gpu", "l40s", "--max-model-len", "8192"]
    generating = weight_bytes(*model, "--runner", "generate")
    pooling = weight_bytes(*model, "--runner", "pooling")
    assert isinstance(generating, int) and isinstance(pooling, int)
    assert generating - pooling == 151680 * 4096 * 2  # its untied LM head, bf16
    assert weight_bytes("--profile", "qwen3-embedding-8b-l40s") == pooling


def test_the_reranker_plan_docs_planner_md_shows(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--model", "Qwen/Qwen3-Reranker-8B", "--gpu", "l40s", "--max-model-len", "8192"]
    data = _plan_json(capsys, *argv, "--runner", "pooling")
    assert data["fits"] is True and data["model"] == "Qwen3-Reranker-8B"
    settings = data["settings"]
    assert isinstance(settings, dict) and settings["runner"] == "pooling"
