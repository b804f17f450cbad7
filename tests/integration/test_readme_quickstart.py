"""The README's quick start, run the way a reader runs it, in a fresh copy of the checkout.

1. The working tree (`git ls-files -co --exclude-standard`: what a clone of this change holds)
   is copied into a temporary directory. Two things are linked instead of rebuilt: `.venv`
   (a fresh one takes ~5 minutes to install) and, when this checkout has built it,
   `var/models` (the tiny model). With the linked venv, `PYTHONPATH` points at the copy, so its
   `serving` is imported, as from a venv installed there; the copy's pyproject.toml and
   Makefile get the venv stamp's age, so `make` does not reinstall into the shared venv.
   SERVING_HOME is not set: where state lives is `serving/paths.py`'s decision, as for a reader.
2. `make up` starts in the background, on free ports (`PORT=`, `ENGINE_PORT=`,
   `GATEWAY_METRICS_PORT=`).
3. The README's `serving keys create` line is parsed out of its quick start and run as printed,
   from the copy's root (so the test breaks when the README changes); the key must land in the
   copy's `var/keys.db`, the store `make up`'s gateway reads.
4. The official `openai` client calls the API with the new secret: 200, limited by that key;
   the key's series are on the gateway's metrics port, not on the API port's /metrics.
5. Ctrl-C (SIGINT to make's process group, as a terminal sends it) stops everything: no
   process is left.

The engine takes 60-90 s to become healthy on a busy 2-core machine (more on its first start,
which compiles, or when the model is built): every wait is on a condition, with a generous
deadline.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest
from openai import OpenAI

from serving.engine.process import http_ok
from tests.integration.conftest import MODEL, descendants, eventually
from tests.ports import free_port

REPO = Path(__file__).resolve().parents[2]
STAMP = REPO / ".venv" / ".installed"
START_DEADLINE_S = 1200.0
KEY_COMMAND = "$ .venv/bin/serving keys create"


def quickstart_key_command(readme: str) -> str:
    """The quick start's `serving keys create` command line (with any continuation lines),
    without its `$ ` prompt."""
    quickstart = readme.split("\n## The two commands", 1)[1].split("\n## ", 1)[0]
    lines = quickstart.splitlines()
    for index, line in enumerate(lines):
        if line.startswith(KEY_COMMAND):
            command = [line.removeprefix("$ ")]
            while command[-1].endswith("\\"):
                index += 1
                command.append(lines[index])
            return "\n".join(command)
    raise AssertionError(f"README.md's quick start has no `{KEY_COMMAND}` line")


def copy_checkout(destination: Path) -> None:
    """The working tree as a clone of it would hold it, with the venv and models linked."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "-co", "--exclude-standard"],
        cwd=REPO, capture_output=True, check=True,
    ).stdout.decode()  # fmt: skip
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if not source.exists():  # deleted in the working tree, not yet in git
            continue
        target = destination / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target, follow_symlinks=False)
    (destination / ".venv").symlink_to(REPO / ".venv")
    if (REPO / "var" / "models").is_dir():
        (destination / "var").mkdir()
        (destination / "var" / "models").symlink_to(REPO / "var" / "models")
    # The linked venv stands for one installed from these very files.
    installed = STAMP.stat().st_mtime - 1
    for name in ("pyproject.toml", "Makefile"):
        os.utime(destination / name, (installed, installed))


def reader_env(checkout: Path) -> dict[str, str]:
    """The caller's environment without the stack's own variables, importing the copy."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("SERVING_") and name not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")
    }
    env["PYTHONPATH"] = str(checkout)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def port_pair() -> int:
    """A free port whose successor is free too (the engine's and the launcher's metrics)."""
    for _ in range(100):
        port = free_port()
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise AssertionError("no two adjacent free ports")


@dataclass
class MakeUp:
    process: subprocess.Popen[bytes]
    log: Path
    port: int
    metrics_port: int

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    if not (REPO / ".git").exists() or shutil.which("git") is None:
        pytest.skip("needs this project as a git checkout")
    if not STAMP.exists():
        pytest.skip("needs this checkout's .venv installed by make (.venv/.installed)")
    copy = tmp_path / "qwen-serving"
    copy_checkout(copy)
    return copy


@pytest.fixture
def make_up(checkout: Path, tmp_path: Path) -> Iterator[MakeUp]:
    env = reader_env(checkout)
    up_to_date = subprocess.run(["make", "-q", ".venv/.installed"], cwd=checkout, env=env)
    assert up_to_date.returncode == 0, "make would reinstall the shared .venv"
    engine_port = port_pair()
    port, metrics_port = free_port(), free_port()
    while port in (engine_port, engine_port + 1):
        port = free_port()
    while metrics_port in (port, engine_port, engine_port + 1):
        metrics_port = free_port()
    log = tmp_path / "make-up.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            ["make", "up", f"PORT={port}", f"ENGINE_PORT={engine_port}",
             f"GATEWAY_METRICS_PORT={metrics_port}"],
            cwd=checkout, env=env, stdout=sink, stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, like a terminal's foreground job
        )  # fmt: skip
    running = MakeUp(process, log, port, metrics_port)
    try:
        yield running
    finally:
        if process.poll() is None:  # the test failed before its Ctrl-C: clean up after it
            left = descendants(process.pid)
            os.killpg(process.pid, signal.SIGINT)
            try:
                process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                process.kill()
            _, alive = psutil.wait_procs(left, timeout=30)
            for leftover in alive:
                leftover.kill()


def wait_until_ready(stack: MakeUp) -> None:
    url = f"http://127.0.0.1:{stack.port}/readyz"
    deadline = time.monotonic() + START_DEADLINE_S
    while not http_ok(url):
        code = stack.process.poll()
        assert code is None, f"make up exited with {code}:\n{stack.tail()}"
        assert time.monotonic() < deadline, (
            f"{url} not ready in {START_DEADLINE_S:.0f}s:\n{stack.tail()}"
        )
        time.sleep(1)


@pytest.mark.timeout(START_DEADLINE_S + 600)
def test_readme_quickstart_from_a_fresh_copy(checkout: Path, make_up: MakeUp) -> None:
    command = quickstart_key_command((checkout / "README.md").read_text(encoding="utf-8"))
    wait_until_ready(make_up)

    created = subprocess.run(
        ["bash", "-c", command], cwd=checkout, env=reader_env(checkout),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert created.returncode == 0, created.stdout + created.stderr
    where = re.search(r"^created (key_[0-9a-f]{8}) \(.+\) in (.+)$", created.stdout, re.MULTILINE)
    secret = re.search(r"^secret: (sk-\S+)$", created.stdout, re.MULTILINE)
    assert where and secret, created.stdout
    assert Path(where.group(2)) == checkout / "var" / "keys.db"

    client = OpenAI(base_url=f"http://127.0.0.1:{make_up.port}/v1", api_key=secret.group(1))
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=8
    )
    assert raw.status_code == 200
    reply = raw.parse()
    assert reply.choices[0].message.content
    rpm = re.search(r"--rpm (\d+)", command)
    assert rpm is not None and raw.headers["x-ratelimit-limit-requests"] == rpm.group(1)
    series = f'key="{where.group(1)}"'  # recorded once the request ended: polled
    private = f"http://127.0.0.1:{make_up.metrics_port}/metrics"
    eventually(lambda: series in httpx.get(private, timeout=10).text)
    public = httpx.get(f"http://127.0.0.1:{make_up.port}/metrics", timeout=10)
    assert public.status_code == 200 and 'key="' not in public.text

    children = descendants(make_up.process.pid)
    assert children, "make up has no child processes"
    os.killpg(make_up.process.pid, signal.SIGINT)
    make_up.process.wait(timeout=180)
    _, alive = psutil.wait_procs(children, timeout=60)
    assert not alive, f"processes left behind by make up: {alive}\n{make_up.tail()}"
    assert not http_ok(f"http://127.0.0.1:{make_up.port}/healthz")
