import json

import pytest

from serving.cli import main


def test_list_shows_every_profile(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profiles", "list"]) == 0
    out = capsys.readouterr().out
    assert "cpu-tiny " in out and "cpu-tiny-tp2" in out and "qwen2.5-7b-awq-4090" in out


def test_show_is_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profiles", "show", "cpu-tiny-tp2"]) == 0
    assert json.loads(capsys.readouterr().out)["tensor_parallel_size"] == 2


def test_render_prints_the_vllm_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profiles", "render", "qwen2.5-7b-fp16-tp4-4090", "--port", "9000"]) == 0
    out = capsys.readouterr().out
    assert "--tensor-parallel-size 4" in out and "--port 9000" in out
    assert "--host 127.0.0.1" in out


def test_bad_profile_is_one_line_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profiles", "show", "tests/fixtures/broken-profile.yaml"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "max_model_len" in err
