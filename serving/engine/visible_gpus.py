"""How many NVIDIA GPUs a vLLM started here would see, without importing any GPU library.

The launcher asks before starting vLLM: a TP=4 profile on a laptop otherwise spends half a
minute downloading and initialising before CUDA says there is nothing to run on. Importing
torch to ask would cost seconds and needs the CUDA build, so the count comes from the driver's
own files (`/proc/driver/nvidia/gpus`, one entry per GPU, masked to the container's GPUs by
the NVIDIA container runtime) or `nvidia-smi -L`, then CUDA_VISIBLE_DEVICES narrows it the
way the CUDA runtime does. `SERVING_VISIBLE_GPUS=N` overrides all of it for hosts this does
not understand (a false "0 visible" would otherwise lock a working machine out).

Usage: `gpus = visible_gpus(os.environ); gpus.count, gpus.source`.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

NVIDIA_PROC_GPUS = Path("/proc/driver/nvidia/gpus")
OVERRIDE_ENV = "SERVING_VISIBLE_GPUS"


@dataclass(frozen=True)
class VisibleGpus:
    """A GPU count and how it was found (shown when the count is too small)."""

    count: int
    source: str


def _nvidia_smi_count() -> int | None:
    """GPUs `nvidia-smi -L` lists; None without a working nvidia-smi."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        result = subprocess.run(
            [smi, "-L"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if result.returncode != 0:
        return None
    # MIG instances are indented lines under their GPU; the launcher counts whole GPUs.
    return sum(1 for line in result.stdout.splitlines() if line.startswith("GPU "))


def physical_gpus(
    proc_dir: Path = NVIDIA_PROC_GPUS, smi: Callable[[], int | None] = _nvidia_smi_count
) -> VisibleGpus:
    """NVIDIA GPUs the driver exposes to this process, before CUDA_VISIBLE_DEVICES."""
    try:
        return VisibleGpus(sum(1 for _ in proc_dir.iterdir()), str(proc_dir))
    except OSError:
        pass
    count = smi()
    if count is not None:
        return VisibleGpus(count, "nvidia-smi -L")
    return VisibleGpus(0, f"no NVIDIA driver: no {proc_dir}, no working nvidia-smi")


def _cuda_visible(value: str, physical: int) -> int:
    """How many devices CUDA enumerates for CUDA_VISIBLE_DEVICES=`value` on `physical` GPUs.

    CUDA reads the list in order and stops at the first entry it cannot use (empty, negative,
    out of range), so "0,1,-1,2" is two devices and "" or "-1" hides every GPU.
    """
    seen: set[str] = set()
    for raw in value.split(","):
        entry = raw.strip()
        if not entry or entry in seen:
            break
        if entry.lstrip("-").isdigit() and not 0 <= int(entry) < physical:
            break
        seen.add(entry)
    return min(len(seen), physical)


def visible_gpus(
    env: Mapping[str, str], physical: Callable[[], VisibleGpus] = physical_gpus
) -> VisibleGpus:
    """The GPUs vLLM would see if started with environment `env`."""
    override = env.get(OVERRIDE_ENV, "").strip()
    if override.isdigit():
        return VisibleGpus(int(override), f"{OVERRIDE_ENV}={override}")
    found = physical()
    mask = env.get("CUDA_VISIBLE_DEVICES")
    if mask is None or found.count == 0:
        return found
    return VisibleGpus(
        _cuda_visible(mask, found.count),
        f"{found.count} on this host ({found.source}), CUDA_VISIBLE_DEVICES={mask!r}",
    )
