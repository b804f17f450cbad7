"""Accelerators the planner knows: memory vLLM sees and memory bandwidth.

`memory_bytes` is the device total as CUDA reports it (`cudaMemGetInfo`, what vLLM multiplies
by `gpu_memory_utilization`): a little below the marketing size because the driver keeps
some. The figures are approximate; `--gpu-memory-gib` replaces them with the total vLLM logs
("Free memory on device (x/TOTAL GiB)"). The `cpu` pseudo-device has no memory of its own
here: vLLM's CPU engine gets a fixed KV cache space (`VLLM_CPU_KVCACHE_SPACE`, GiB).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from serving.errors import ServingError

MiB = 1024**2
GiB = 1024**3


@dataclass(frozen=True, kw_only=True)
class GpuSpec:
    name: str  # the identifier used on the command line and in profiles
    label: str  # what people call it
    memory_bytes: int  # 0 for the cpu pseudo-device
    bandwidth_gb_s: float | None  # HBM/GDDR bandwidth, 1e9 bytes per second
    is_cpu: bool = False

    @property
    def bandwidth_bytes_s(self) -> float | None:
        return None if self.bandwidth_gb_s is None else self.bandwidth_gb_s * 1e9


GPUS: dict[str, GpuSpec] = {
    gpu.name: gpu
    for gpu in (
        # 24 GB GDDR6X, 21 Gbps x 384 bit = 1008 GB/s; CUDA reports ~23.64 GiB.
        GpuSpec(name="rtx-4090", label="RTX 4090 24 GB", memory_bytes=24207 * MiB,
                bandwidth_gb_s=1008),
        GpuSpec(name="rtx-4090d", label="RTX 4090D 24 GB", memory_bytes=24207 * MiB,
                bandwidth_gb_s=1008),
        GpuSpec(name="l40s", label="L40S 48 GB", memory_bytes=45456 * MiB,
                bandwidth_gb_s=864),
        GpuSpec(name="a100-40gb", label="A100 40 GB", memory_bytes=40337 * MiB,
                bandwidth_gb_s=1555),
        GpuSpec(name="a100-80gb", label="A100 80 GB", memory_bytes=81050 * MiB,
                bandwidth_gb_s=2039),
        GpuSpec(name="h100-80gb", label="H100 80 GB SXM", memory_bytes=81090 * MiB,
                bandwidth_gb_s=3350),
        GpuSpec(name="h200", label="H200 141 GB", memory_bytes=143166 * MiB,
                bandwidth_gb_s=4800),
        GpuSpec(name="cpu", label="CPU (vLLM CPU engine)", memory_bytes=0,
                bandwidth_gb_s=None, is_cpu=True),
    )
}  # fmt: skip

_ALIASES = {
    "4090": "rtx-4090",
    "4090d": "rtx-4090d",
    "a100": "a100-80gb",
    "a100-40g": "a100-40gb",
    "a100-80g": "a100-80gb",
    "h100": "h100-80gb",
    "h100-sxm": "h100-80gb",
    "h200-141gb": "h200",
}


def _normalize(name: str) -> str:
    key = name.strip().lower().replace("_", "-").replace(" ", "-")
    key = key.removeprefix("nvidia-").removeprefix("geforce-")
    return _ALIASES.get(key, key)


def get_gpu(name: str) -> GpuSpec:
    """A GPU by name (`rtx-4090`, `RTX 4090`, `h100`, ...); ServingError names the flag."""
    key = _normalize(name)
    if key not in GPUS:
        rtx = f"rtx-{key}"
        if rtx in GPUS:
            return GPUS[rtx]
        raise ServingError(f"--gpu: unknown GPU {name!r} (known: {', '.join(GPUS)})")
    return GPUS[key]


def with_memory(gpu: GpuSpec, memory_gib: float) -> GpuSpec:
    """The same GPU with the total memory vLLM reported (`--gpu-memory-gib`)."""
    if memory_gib <= 0:
        raise ServingError(f"--gpu-memory-gib: must be > 0, got {memory_gib}")
    return replace(gpu, memory_bytes=int(memory_gib * GiB))


def larger_gpus(gpu: GpuSpec) -> list[GpuSpec]:
    """GPUs with more memory than `gpu`, smallest first (for suggestions)."""
    bigger = [g for g in GPUS.values() if not g.is_cpu and g.memory_bytes > gpu.memory_bytes]
    return sorted(bigger, key=lambda g: g.memory_bytes)
