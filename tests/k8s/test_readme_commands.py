"""The docs' Kubernetes commands that need no cluster, run as printed.

- docs/kubernetes.md's block: each `.venv/bin/serving k8s ...` line (the render to stdout,
  rewriting the overlays' patches, which leaves them unchanged, and the drift check);
- k8s/README.md step 3: the `serving keys create ... --emit-yaml > keys.yaml` line, then the
  `kubectl create secret generic gateway-keys --from-file=keys.yaml` line with kubectl's
  `--dry-run=client -o yaml` (no API server here): the Secret it would create holds the key
  file under the item the gateway Deployment mounts, and the gateway's key store
  authenticates the printed secret from it with the limits the line asked for.

The lines are parsed out of those pages, so editing them without keeping them working fails
here.
"""

from __future__ import annotations

import base64
import os
import re
import shlex
import subprocess
from pathlib import Path

import yaml

from serving.gateway.keys.file_store import FileKeyStore
from tests.k8s.rendered import Renders
from tests.k8s.tools import ROOT, tool

KUBERNETES_DOC = ROOT / "docs" / "kubernetes.md"
K8S_README = ROOT / "k8s" / "README.md"


def section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n##", start + len(heading))  # the next heading (bash comments: one #)
    return text[start : end if end != -1 else len(text)]


def bash_lines(markdown: str) -> list[str]:
    """Commands in the ```bash blocks, comments and continuation lines joined."""
    lines: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", markdown, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            command = line.split("  #", 1)[0].strip()
            if command and not command.startswith("#"):
                lines.append(command)
    return lines


def run(command: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, shell=True, cwd=cwd, capture_output=True, text=True, timeout=120,
        env={**os.environ, **env},
    )  # fmt: skip


def test_the_docs_render_commands_work_as_printed() -> None:
    commands = [
        line
        for line in bash_lines(KUBERNETES_DOC.read_text())
        if line.startswith(".venv/bin/serving k8s")
    ]
    assert len(commands) == 3, commands
    for command in commands:
        done = run(command, ROOT)
        assert done.returncode == 0, f"{command}:\n{done.stderr}"
    assert "kind: Deployment" in run(commands[0], ROOT).stdout
    status = subprocess.run(
        ["git", "status", "--porcelain", "k8s/overlays"], cwd=ROOT, capture_output=True,
        text=True, check=True,
    )  # fmt: skip
    assert status.stdout == "", f"rewriting the patches changed them:\n{status.stdout}"


def test_the_keys_secret_lines_work_as_printed(tmp_path: Path, renders: Renders) -> None:
    steps = bash_lines(section(K8S_README.read_text(), "### 3. Namespace and Secrets"))
    [create] = [line for line in steps if "serving keys create" in line]
    [secret] = [line for line in steps if "create secret generic gateway-keys" in line]
    # The checkout's venv and kubectl stand in for what a reader's PATH has.
    done = run(create.replace(".venv/bin/serving", str(ROOT / ".venv" / "bin" / "serving")),
               tmp_path, SERVING_HOME=str(tmp_path / "home"))  # fmt: skip
    assert done.returncode == 0, done.stderr
    printed = re.search(r"secret: (\S+)", done.stderr)
    assert printed, done.stderr
    argv = shlex.split(secret)
    assert argv[0] == "kubectl"
    dry = [str(tool("kubectl")), *argv[1:], "--dry-run=client", "-o", "yaml"]
    made = subprocess.run(
        dry, cwd=tmp_path, capture_output=True, text=True, timeout=60,
        env={**os.environ, "KUBECONFIG": str(tmp_path / "no-cluster")},
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    secret_object = yaml.safe_load(made.stdout)
    assert secret_object["metadata"] == {"name": "gateway-keys", "namespace": "qwen-serving"}
    # The item the Deployment mounts, where SERVING_GATEWAY_KEYS_FILE points.
    spec = renders("cpu-demo").one("Deployment", "gateway")["spec"]["template"]["spec"]
    [volume] = [
        v for v in spec["volumes"] if v.get("secret", {}).get("secretName") == "gateway-keys"
    ]
    [item] = volume["secret"]["items"]
    mounted = tmp_path / "mounted" / item["path"]
    mounted.parent.mkdir()
    mounted.write_bytes(base64.b64decode(secret_object["data"][item["key"]]))
    record = FileKeyStore(mounted).authenticate(printed.group(1))
    assert record is not None and record.name == "team-a"
    limits = record.limits
    assert (limits.rpm, limits.tpm, limits.max_concurrency) == (
        60,
        20000,
        4,
    )
