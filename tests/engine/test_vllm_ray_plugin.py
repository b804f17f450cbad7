"""The Ray-on-CPU vLLM plugin: still needed, registered, and doing exactly its three changes.

Each check runs vLLM in a fresh interpreter: the plugin changes vLLM's classes for the whole
process, and other tests of this session may have loaded vLLM's plugins already.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import entry_points
from typing import Any

PROBE = """
import json, ray
from vllm.plugins import load_general_plugins
from vllm.platforms import current_platform
from vllm.v1.executor import ray_executor_v2

if {load}:
    load_general_plugins()

def accepted(kwargs):
    try:
        ray.remote(object).options(num_cpus=0, **kwargs)
    except ValueError:
        return False
    return True

kwargs = ray_executor_v2.RayExecutorV2._get_actor_resource_kwargs()
print(json.dumps({{
    "device_key": current_platform.ray_device_key,
    "actor_kwargs": kwargs,
    "ray_accepts_them": accepted(kwargs),
    "worker": ray_executor_v2.RayWorkerProc.__module__,
}}))
"""


def probe(*, load_plugins: bool) -> dict[str, Any]:
    env = {**os.environ, "VLLM_PLUGINS": "" if not load_plugins else "serving_ray_cpu"}
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(load=load_plugins)],
        env=env, capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_vllm_still_refuses_ray_on_cpu() -> None:
    """When this fails, vLLM runs Ray on CPUs by itself: delete the plugin and its entry."""
    vllm = probe(load_plugins=False)
    assert vllm["device_key"] == "", "vLLM's CPU platform has a Ray device key now"
    # Asked for a "CPU" device, vLLM's executor would request it as a custom resource.
    assert vllm["worker"] == "vllm.v1.executor.ray_executor_v2"


def test_the_plugin_lets_the_cpu_platform_place_workers_on_ray() -> None:
    patched = probe(load_plugins=True)
    assert patched["device_key"] == "CPU"
    assert patched["actor_kwargs"] == {"num_gpus": 0}
    assert patched["ray_accepts_them"]
    assert patched["worker"] == "serving.engine.ray_cpu_worker"


def test_ray_refuses_the_resources_vllm_would_ask_for_on_cpu() -> None:
    import ray

    try:
        ray.remote(object).options(num_cpus=0, num_gpus=0, resources={"CPU": 1})
    except ValueError as exc:
        assert "num_cpus" in str(exc)
    else:
        raise AssertionError("Ray accepts CPU as a custom resource now: drop that change")


def test_vllm_finds_the_plugin_beside_the_awq_one() -> None:
    plugins = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert plugins["serving_ray_cpu"] == "serving.engine.vllm_ray_plugin:register"
    assert "serving_awq" in plugins
