"""LiteLLM's proxy as a comparison path, installed in its own throwaway venv on first use.

    executable = ensure_installed(VENV_DIR, log=INSTALL_LOG)
    argv, env = proxy_command(executable, config_dir, upstream_url, port, master_key)

The venv lives under `bench/.venvs/` (git-ignored), apart from the project's own, so
LiteLLM's many pinned dependencies never touch it. The version is pinned so results stay
comparable; the venv is rebuilt when the pin changes.

LiteLLM runs with its defaults and one worker. What the benchmark sets, and why:
- a master key (`LITELLM_MASTER_KEY`): recent releases refuse to start without one, and
  checking it is the analogue of our gateway's key check;
- `LITELLM_LOCAL_MODEL_COST_MAP=True`: otherwise it downloads its model price list at
  start-up, and nothing outside 127.0.0.1 may be reached;
- `--host 127.0.0.1` (its default is every interface).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

LITELLM_REQUIREMENT = "litellm[proxy]==1.108.7"
VENV_DIR = Path(__file__).resolve().parent.parent / ".venvs" / "litellm"
INSTALL_LOG = VENV_DIR.with_name("litellm-install.log")
INSTALL_TIMEOUT_S = 1200.0
MARKER = ".bench-installed"


class LiteLLMUnavailable(Exception):
    """LiteLLM could not be installed; the message says why."""


def ensure_installed(venv: Path, *, log: Path) -> Path:
    """The venv's `litellm` executable, installing it first when needed."""
    executable = venv / "bin" / "litellm"
    marker = venv / MARKER
    if executable.exists() and marker.exists() and marker.read_text() == LITELLM_REQUIREMENT:
        return executable
    steps = (
        [sys.executable, "-m", "venv", "--clear", str(venv)],
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", LITELLM_REQUIREMENT],
    )
    # A fresh clone has no bench/.venvs yet (it is git-ignored).
    venv.parent.mkdir(parents=True, exist_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        for step in steps:
            try:
                done = subprocess.run(
                    step,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    timeout=INSTALL_TIMEOUT_S,
                    check=False,
                )
            except subprocess.TimeoutExpired as exc:
                raise LiteLLMUnavailable(
                    f"`{' '.join(step)}` did not finish in {INSTALL_TIMEOUT_S:.0f} s"
                ) from exc
            if done.returncode != 0:
                raise LiteLLMUnavailable(
                    f"`{' '.join(step)}` failed with status {done.returncode}: {_last_error(log)}"
                )
    if not executable.exists():
        raise LiteLLMUnavailable(f"{LITELLM_REQUIREMENT} installed no {executable}")
    marker.write_text(LITELLM_REQUIREMENT)
    return executable


def _last_error(log: Path) -> str:
    lines = [
        line
        for line in log.read_text(errors="replace").splitlines()
        if line.strip() and "is ignored: it is neither a file nor a directory" not in line
    ]
    shown = [line if len(line) <= 200 else line[:120] + " ... " + line[-60:] for line in lines]
    return " | ".join(shown[-2:]) + f" (full log: {log})"


def proxy_command(
    executable: Path, config_dir: Path, *, upstream: str, port: int, master_key: str, model: str
) -> tuple[list[str], dict[str, str]]:
    """Command line and environment of a one-worker LiteLLM proxy serving `model` from the
    OpenAI-compatible `upstream`."""
    config = config_dir / "litellm.yaml"
    # JSON is YAML: no YAML writer needed for this small file.
    entry = {
        "model_name": model,
        "litellm_params": {
            "model": f"openai/{model}",
            "api_base": upstream.rstrip("/") + "/v1",
            "api_key": "sk-upstream-unused",
        },
    }
    config.write_text(json.dumps({"model_list": [entry]}, indent=2))
    argv = [
        str(executable),
        "--config",
        str(config),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--num_workers",
        "1",
    ]
    env = {"LITELLM_MASTER_KEY": master_key, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    return argv, env
