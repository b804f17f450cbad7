"""`serving k8s render`, and the drift test: every committed overlay patch is its profile's
render, and a profile change is caught until the patch is regenerated."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from serving.cli import main
from serving.k8s.engine_patch import render_patch
from serving.k8s.overlays import (
    GENERATED_NAME,
    OVERLAYS,
    OVERLAYS_DIR,
    generated_path,
    stale_overlays,
    write_overlays,
)
from serving.profiles import load_profile
from serving.profiles.loader import PROFILES_DIR
from tests.k8s.tools import ROOT

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_committed_overlay_patch_matches_its_profile(overlay: str) -> None:
    committed = generated_path(REPO, overlay).read_text(encoding="utf-8")
    assert committed == render_patch(load_profile(OVERLAYS[overlay])), (
        f"{generated_path(REPO, overlay).relative_to(REPO)} drifted from profile "
        f"{OVERLAYS[overlay]}: run `serving k8s render --all`"
    )


def test_every_overlay_directory_has_a_profile() -> None:
    directories = {path.name for path in (REPO / OVERLAYS_DIR).iterdir() if path.is_dir()}
    assert directories == set(OVERLAYS)


def test_render_prints_the_patch(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["k8s", "render", "--profile", "cpu-tiny"]) == 0
    assert capsys.readouterr().out == render_patch(load_profile("cpu-tiny"))


def test_render_out_writes_the_file(tmp_path: Path) -> None:
    out = tmp_path / "engine.yaml"
    assert main(["k8s", "render", "--profile", "qwen2.5-7b-awq-4090", "--out", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == render_patch(load_profile("qwen2.5-7b-awq-4090"))


def test_unknown_profile_is_one_line_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["k8s", "render", "--profile", "no-such-profile"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--profile" in err and "no-such-profile" in err


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--all", "--out", "x.yaml"], "--out"),
        (["--profile", "cpu-tiny", "--check"], "--check"),
    ],
)
def test_options_that_do_not_go_together(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["k8s", "render", *argv]) == 2
    assert flag in capsys.readouterr().err


def test_all_writes_every_overlay_and_check_names_the_drifted_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A LeaderWorkerSet engine (a profile across nodes) is built from the base's engine pod.
    shutil.copytree(ROOT / "k8s" / "base", tmp_path / "k8s" / "base")
    assert main(["k8s", "render", "--all", "--root", str(tmp_path)]) == 0
    written = capsys.readouterr().out.splitlines()
    assert len(written) == len(OVERLAYS) + sum("/leaderworkerset." in line for line in written)
    for overlay in OVERLAYS:
        assert (tmp_path / OVERLAYS_DIR / overlay / GENERATED_NAME).is_file()
    assert main(["k8s", "render", "--all", "--check", "--root", str(tmp_path)]) == 0
    edited = generated_path(tmp_path, "gpu-128k")
    edited.write_text(edited.read_text(encoding="utf-8").replace("'4'", "'2'"), encoding="utf-8")
    generated_path(tmp_path, "cpu-demo").unlink()
    before = edited.read_text(encoding="utf-8")
    assert main(["k8s", "render", "--all", "--check", "--root", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "gpu-128k" in err and "cpu-demo" in err and "gpu-awq-1x24gb" not in err
    assert edited.read_text(encoding="utf-8") == before  # --check writes nothing
    assert not generated_path(tmp_path, "cpu-demo").exists()
    assert main(["k8s", "render", "--all", "--root", str(tmp_path)]) == 0
    assert main(["k8s", "render", "--all", "--check", "--root", str(tmp_path)]) == 0


def test_a_profile_change_is_caught_until_regenerated(tmp_path: Path) -> None:
    source = PROFILES_DIR / "qwen2.5-7b-awq-4090.yaml"
    profile_file = tmp_path / "edited.yaml"
    shutil.copy(source, profile_file)
    overlays = {"edited": str(profile_file)}
    assert [r.overlay for r in write_overlays(tmp_path, overlays)] == ["edited"]
    assert stale_overlays(tmp_path, overlays) == []
    data = yaml.safe_load(profile_file.read_text(encoding="utf-8"))
    profile_file.write_text(yaml.safe_dump({**data, "max_model_len": 8192}), encoding="utf-8")
    assert [r.overlay for r in stale_overlays(tmp_path, overlays)] == ["edited"]
    assert [r.overlay for r in write_overlays(tmp_path, overlays)] == ["edited"]
    assert "'8192'" in generated_path(tmp_path, "edited").read_text(encoding="utf-8")
    assert write_overlays(tmp_path, overlays) == []  # unchanged files are left alone


def test_all_needs_a_repository_with_k8s(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["k8s", "render", "--all", "--root", str(tmp_path)]) == 2
    assert "--root" in capsys.readouterr().err
