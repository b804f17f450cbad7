"""`serving up` under supervisord, as docs/getting-started.md shows it: `supervisorctl stop`
(SIGTERM to the program's process group, `stopasgroup`) after a stream leaves no process of
the stack and no port behind, and the log says how it stopped.

The program section is read from the page itself (the checkout's path and free ports put in),
so the page shows what was tested, and runs under Debian's `supervisor` package (what the page
tells users to install; `make system-deps` installs it).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest
from openai import OpenAI

from serving.engine.port_check import refuse_taken
from tests.integration.conftest import MODEL, REPO, TEST_KEY, descendants, serving_env
from tests.ports import free_port

PAGE = REPO / "docs" / "getting-started.md"
PLACEHOLDER = "/srv/qwen-serving"
START_S = 900


def debian_binary(name: str) -> str:
    """Debian's supervisord or supervisorctl, never a copy from PyPI in the venv."""
    path = shutil.which(name, path="/usr/bin")
    assert path, f"/usr/bin/{name} is missing: `make system-deps` installs Debian's supervisor"
    return path


def program_section() -> str:
    """The page's supervisord program section."""
    blocks: list[str] = re.findall(r"```ini\n(.*?)```", PAGE.read_text(encoding="utf-8"), re.DOTALL)
    sections = [block for block in blocks if block.startswith("[program:qwen-serving]")]
    assert len(sections) == 1, "docs/getting-started.md shows one supervisord program"
    return sections[0]


@dataclass
class Supervised:
    conf: Path
    log: Path
    ports: dict[int, str]
    url: str

    def ctl(self, *args: str) -> str:
        argv = [debian_binary("supervisorctl"), "-c", str(self.conf), *args]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=180)
        return done.stdout + done.stderr


@pytest.fixture
def supervised(tmp_path: Path) -> Iterator[Supervised]:
    port, engine_port, launcher_port, metrics_port = (free_port() for _ in range(4))
    flags = f" --port {port} --engine-port {engine_port} --metrics-port {launcher_port}"
    flags += f" --gateway-metrics-port {metrics_port} --keys-db {tmp_path / 'keys.db'}"
    program = program_section().replace(PLACEHOLDER, str(REPO))
    program = re.sub(r"^(command=.*)$", lambda m: m.group(1) + flags, program, flags=re.M)
    log = tmp_path / "stack.log"
    conf = tmp_path / "supervisord.conf"
    conf.write_text(
        f"[unix_http_server]\nfile={tmp_path / 'supervisor.sock'}\n\n"
        f"[supervisord]\nnodaemon=true\nlogfile={tmp_path / 'supervisord.log'}\n"
        f"pidfile={tmp_path / 'supervisord.pid'}\nchildlogdir={tmp_path}\n\n"
        "[rpcinterface:supervisor]\n"
        "supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface\n\n"
        f"[supervisorctl]\nserverurl=unix://{tmp_path / 'supervisor.sock'}\n\n"
        f"{program}stdout_logfile={log}\n"
    )
    daemon = subprocess.Popen(
        [debian_binary("supervisord"), "-c", str(conf)],
        env=serving_env(SERVING_API_KEY=TEST_KEY), cwd=tmp_path,
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    ports = {port: "gateway", engine_port: "engine", launcher_port: "launcher"}
    ports[metrics_port] = "gateway metrics"
    running = Supervised(conf, log, ports, f"http://127.0.0.1:{port}")
    try:
        yield running
    finally:
        left = descendants(daemon.pid)
        daemon.terminate()  # supervisord stops its programs first, then exits
        try:
            daemon.wait(timeout=120)
        except subprocess.TimeoutExpired:
            daemon.kill()
        for process in psutil.wait_procs(left, timeout=30)[1]:
            process.kill()


def _wait_healthy(supervised: Supervised) -> None:
    deadline = time.monotonic() + START_S
    while not _ok(f"{supervised.url}/healthz"):
        log = supervised.log.read_text() if supervised.log.exists() else ""
        assert "FATAL" not in supervised.ctl("status"), log[-3000:]
        assert time.monotonic() < deadline, log[-3000:]
        time.sleep(1)


def _ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def test_supervisorctl_stop_leaves_nothing_of_the_stack(supervised: Supervised) -> None:
    _wait_healthy(supervised)
    client = OpenAI(base_url=f"{supervised.url}/v1", api_key=TEST_KEY, max_retries=0)
    chunks = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=16, stream=True
    )
    assert sum(1 for _ in chunks) > 1
    pid = int(supervised.ctl("pid", "qwen-serving").strip())
    stack = [psutil.Process(pid), *descendants(pid)]
    names = " ".join(" ".join(process.cmdline()) for process in stack)
    assert "vllm.entrypoints.openai.api_server" in names and "serving.cli gateway" in names
    assert "stopped" in supervised.ctl("stop", "qwen-serving")
    _, alive = psutil.wait_procs(stack, timeout=30)
    assert not alive, f"left behind by supervisorctl stop: {alive}"
    refuse_taken(dict.fromkeys(supervised.ports, "after supervisorctl stop, the stack's"))
    log = supervised.log.read_text()
    assert "SIGTERM received" in log and "stopping gateway and vLLM" in log
    assert re.search(r"vLLM \(PID \d+\) and its workers stopped by SIGTERM in ", log), log[-2000:]
