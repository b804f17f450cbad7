"""A vLLM plugin: run vLLM's CPU engine with Ray as the executor (one model across nodes;
docs/multi-node.md). vLLM 0.32's CPU platform refuses Ray (`current platform cpu does not
support ray`).

Rules (each applied only where vLLM still refuses: the CPU platform, its `ray_device_key`
empty; a vLLM that supports Ray on CPUs is left alone):
- the CPU platform's `ray_device_key` becomes `CPU`, so the placement group reserves one Ray
  CPU per worker and a worker lands on each node that offers one;
- the executor (`RayExecutorV2`) asks Ray for no GPU and no custom resource per worker;
- its worker reports no GPU ids (`ray_cpu_worker.CpuRayWorkerProc`).
Loaded in each vLLM process through the `vllm.general_plugins` entry point. A test fails once
vLLM accepts Ray on CPUs itself: then delete this module.
"""

from __future__ import annotations

import importlib.util
from typing import Any

RAY_DEVICE_KEY = "CPU"


def vllm_refuses_ray_on_cpu() -> bool:
    """True where this process runs vLLM's CPU platform and that platform refuses Ray."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu()) and not current_platform.ray_device_key


def _no_accelerator_resources() -> dict[str, Any]:
    # Replaces `RayExecutorV2._get_actor_resource_kwargs`: the actor joins its placement-group
    # bundle (which holds the CPU) and asks for nothing else.
    return {"num_gpus": 0}


def register() -> None:
    """Entry point: teach this vLLM process's CPU platform and Ray executor to use Ray."""
    if importlib.util.find_spec("ray") is None or not vllm_refuses_ray_on_cpu():
        return
    from vllm.platforms import current_platform
    from vllm.v1.executor import ray_executor_v2

    from serving.engine.ray_cpu_worker import CpuRayWorkerProc

    type(current_platform).ray_device_key = RAY_DEVICE_KEY
    executor = ray_executor_v2.RayExecutorV2
    # Replacing vLLM's methods and class is the point of this plugin (mypy forbids both).
    executor._get_actor_resource_kwargs = staticmethod(_no_accelerator_resources)  # type: ignore[method-assign]
    # `_init_executor` creates its actors from this module attribute at call time.
    ray_executor_v2.RayWorkerProc = CpuRayWorkerProc  # type: ignore[misc]
