"""`serving model awq`: quantizes a checkpoint and prints where; bad flags get one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from serving.cli import main
from tests.quantize.conftest import SMALL, write_qwen3


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_qwen3(tmp_path_factory.mktemp("source") / "small-qwen3", SMALL)


def test_awq_command_quantizes_and_prints_the_directory(
    source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = tmp_path / "calibration.txt"
    text.write_text("Boats came in at dusk and the harbour lights went on one by one. " * 30)
    out = tmp_path / "out"
    argv = ["model", "awq", "--model", str(source), "--out", str(out), "--group-size", "64",
            "--samples", "2", "--seq-len", "32", "--calibration", str(text)]  # fmt: skip
    assert main(argv) == 0
    assert capsys.readouterr().out.strip() == str(out.resolve())
    config = json.loads((out / "config.json").read_text())
    assert config["quantization_config"]["group_size"] == 64


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--group-size", "100"], "--group-size 100: must be one of 32, 64, 128"),
        (["--samples", "0"], "--samples 0: must be at least 1"),
        (["--model", "/nonexistent/model"], "--model /nonexistent/model: not a directory"),
        (["--calibration", "/nonexistent.txt"], "--calibration /nonexistent.txt: cannot read"),
    ],
)
def test_awq_command_bad_flags_get_one_line(
    flags: list[str], message: str, source: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = (
        ["model", "awq", *flags]
        if "--model" in flags
        else ["model", "awq", "--model", str(source), *flags]
    )
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"serving model: error: {message}")


def test_tiny_vl_command_builds_and_prints_the_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "vl"
    assert main(["model", "tiny-vl", "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out.resolve())
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["Qwen2_5_VLForConditionalGeneration"]
    assert (out / "preprocessor_config.json").is_file()


@pytest.mark.parametrize(
    ("kind", "written"),
    [("tiny-embedding", "modules.json"), ("tiny-reranker", "tokenizer.json")],
)
def test_pooling_model_commands_build_and_print_the_directory(
    kind: str, written: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`serving model tiny-embedding` / `serving model tiny-reranker` as docs/profiles.md
    shows them (here with --out, so the test writes under its own directory)."""
    out = tmp_path / kind
    assert main(["model", kind, "--out", str(out)]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed == [str(out.resolve())]
    assert (out / written).is_file() and (out / "build-info.json").is_file()
    assert main(["model", kind, "--out", str(out)]) == 0  # cached: the same directory
    assert capsys.readouterr().out.strip() == str(out.resolve())
