"""cpu-tiny-lora's vLLM, one start for the package (a start costs about a minute on 2 cores).

It is started from the pieces `serving engine --profile cpu-tiny-lora` runs (the built-ins
resolved, the preflight, the rendered command), plus what lets a test read the engine's memory:
vLLM's worker extension hook and its dev-mode `/collective_rpc` route (`lora_buffers.py`).
test_lora.py checks the engine itself; test_tenants.py puts a gateway in front of it.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator

import psutil
import pytest

from serving.engine.preflight import preflight
from serving.engine.process import http_ok
from serving.engine.resolve import resolve_adapters, resolve_model
from serving.profiles import load_profile
from serving.vllm_flags import render
from tests.integration.conftest import REPO, descendants
from tests.integration.tenants.lora_buffers import LoraBuffers
from tests.ports import free_port

PROFILE = "cpu-tiny-lora"


@pytest.fixture(scope="package")
def lora_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """cpu-tiny-lora's vLLM on a free port, its LoRA buffers readable; SIGTERM at the end."""
    profile = load_profile(PROFILE)
    model, adapters = resolve_model(profile), resolve_adapters(profile)
    preflight(profile, model, lambda _: None, adapters=adapters)
    port = free_port()
    command = render(profile, model, port=port, adapter_paths=adapters)
    extension = f"{LoraBuffers.__module__}.{LoraBuffers.__qualname__}"
    argv = [*command.argv, "--worker-extension-cls", extension]
    env = {**command.full_env(), "VLLM_SERVER_DEV_MODE": "1", "PYTHONPATH": str(REPO)}
    log = tmp_path_factory.mktemp("lora") / "engine.log"
    with log.open("w") as sink:
        process = subprocess.Popen(argv, env=env, cwd=REPO, stdout=sink, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while not http_ok(f"{url}/health"):
            assert process.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, f"{PROFILE} engine did not start"
            time.sleep(1)
        yield url
    finally:
        children = descendants(process.pid)
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=90)
        _, alive = psutil.wait_procs(children, timeout=30)
    assert not alive, f"workers left behind: {alive}"
