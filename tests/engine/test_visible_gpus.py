"""Counting the GPUs vLLM would see from the driver's files and CUDA_VISIBLE_DEVICES."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from serving.engine.visible_gpus import (
    OVERRIDE_ENV,
    VisibleGpus,
    _nvidia_smi_count,
    physical_gpus,
    visible_gpus,
)


def four() -> VisibleGpus:
    return VisibleGpus(4, "fake driver")


def test_the_driver_directory_has_one_entry_per_gpu(tmp_path: Path) -> None:
    for bus in ("0000:01:00.0", "0000:02:00.0"):
        (tmp_path / bus).mkdir()
    assert physical_gpus(tmp_path, smi=lambda: 9) == VisibleGpus(2, str(tmp_path))


def test_nvidia_smi_answers_where_the_driver_directory_is_absent(tmp_path: Path) -> None:
    assert physical_gpus(tmp_path / "absent", smi=lambda: 3) == VisibleGpus(3, "nvidia-smi -L")


def test_no_driver_at_all_is_zero_gpus_and_says_why(tmp_path: Path) -> None:
    found = physical_gpus(tmp_path / "absent", smi=lambda: None)
    assert found.count == 0 and "no NVIDIA driver" in found.source


def test_nvidia_smi_lines_are_counted_as_whole_gpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = tmp_path / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        "echo 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-aaa)'\n"
        "echo '  MIG 1g.10gb     Device  0: (UUID: MIG-bbb)'\n"
        "echo 'GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-ccc)'\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert _nvidia_smi_count() == 2


def test_a_failing_nvidia_smi_counts_as_absent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = tmp_path / "nvidia-smi"
    script.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert _nvidia_smi_count() is None


def test_without_cuda_visible_devices_every_gpu_is_visible() -> None:
    assert visible_gpus({}, physical=four) == four()


@pytest.mark.parametrize(
    ("mask", "count"),
    [
        ("", 0),  # hides every GPU
        ("-1", 0),
        ("0,1", 2),
        (" 2 , 3 ", 2),
        ("0,1,-1,2", 2),  # CUDA stops at the first invalid entry
        ("0,7,1", 1),  # 7 does not exist on a 4-GPU host
        ("0,0", 1),
        ("GPU-aaa,GPU-bbb", 2),
        ("0,1,2,3,4,5", 4),
    ],
)
def test_cuda_visible_devices_narrows_the_count_as_cuda_does(mask: str, count: int) -> None:
    found = visible_gpus({"CUDA_VISIBLE_DEVICES": mask}, physical=four)
    assert found.count == count
    assert "CUDA_VISIBLE_DEVICES" in found.source and "fake driver" in found.source


def test_the_override_wins_without_asking_the_driver() -> None:
    def no_driver() -> VisibleGpus:
        raise AssertionError("the override must not look at the driver")

    env = {OVERRIDE_ENV: "4", "CUDA_VISIBLE_DEVICES": ""}
    assert visible_gpus(env, physical=no_driver) == VisibleGpus(4, f"{OVERRIDE_ENV}=4")


def test_a_non_numeric_override_is_ignored() -> None:
    assert visible_gpus({OVERRIDE_ENV: "lots"}, physical=four) == four()
