"""`serving up` never adopts what it did not start (issue: no engine outliving its launcher).

A second start on the ports of the running session stack refuses before it loads anything,
naming the process that holds the port: its gateway, then its vLLM. How the stacks end is
checked where they stop (`conftest.serving_up`): the session's stack is SIGKILLed, vision's
gets SIGHUP to its group, the replicas' (`--replicas 2`) SIGTERM, `make up` SIGINT to its group
(test_readme_quickstart), supervisord's SIGTERM to the group (test_supervised); each time no
process and no port is left.
"""

from __future__ import annotations

import subprocess
import sys
from urllib.parse import urlsplit

import psutil

from tests.integration.conftest import REPO, Stack, serving_env
from tests.integration.scale_out_engines import listening_pid
from tests.ports import free_port


def _port(url: str) -> int:
    port = urlsplit(url).port
    assert port is not None
    return port


def _second_start(gateway_port: int, engine_port: int) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "serving.cli", "up", "--port", str(gateway_port),
            "--engine-port", str(engine_port), "--metrics-port", str(free_port()),
            "--gateway-metrics-port", str(free_port())]  # fmt: skip
    return subprocess.run(
        argv, env=serving_env(), cwd=REPO, capture_output=True, text=True, timeout=120
    )


def test_a_start_on_a_running_stacks_ports_refuses_and_names_what_holds_them(
    stack: Stack,
) -> None:
    gateway_port, engine_port = _port(stack.gateway_url), _port(stack.engine_url)
    before = {child.pid for child in psutil.Process().children(recursive=True)}
    on_gateway = _second_start(gateway_port, free_port())
    assert on_gateway.returncode != 0
    gateway_pid = listening_pid(gateway_port)
    assert (
        f"the gateway's (--port) port {gateway_port} is already in use by PID {gateway_pid} "
        in (on_gateway.stderr)
    ), on_gateway.stderr
    on_engine = _second_start(free_port(), engine_port)
    assert on_engine.returncode != 0
    engine_pid = listening_pid(engine_port)
    assert f"port {engine_port} is already in use by PID {engine_pid} (" in on_engine.stderr
    assert "vllm.entrypoints.openai.api_server" in on_engine.stderr
    for refused in (on_gateway, on_engine):  # nothing was started
        assert "starting vLLM" not in refused.stdout + refused.stderr
    assert {child.pid for child in psutil.Process().children(recursive=True)} <= before
