"""vLLM's Ray worker for the CPU platform: the same worker, reporting no GPU ids.

`RayExecutorV2` asks each worker actor which accelerators Ray gave it
(`get_accelerator_ids()[ray_device_key]`); Ray has no accelerator ids for CPUs, so vLLM's own
method fails there. The executor pickles the worker class by reference, so the override must
live in an importable module: this one, which `vllm_ray_plugin` imports only inside vLLM on a
CPU host with Ray installed (it imports both).
"""

from __future__ import annotations

import ray
from vllm.v1.executor.ray_executor_v2 import RayWorkerProc


class CpuRayWorkerProc(RayWorkerProc):
    """vLLM's `RayWorkerProc`; on CPUs it holds no GPU, so it reports none."""

    def get_node_and_physical_gpu_ids(self) -> tuple[str, list[int]]:
        return str(ray.get_runtime_context().get_node_id()), []
