"""checkov passes on every rendered overlay with k8s/.checkov.yaml, whose every skip is
justified in a comment and needed (the check fails somewhere without it).

checkov takes seconds to start, so it runs once over all the renders (plus a manifest that
breaks the rules on purpose, to show the config leaves checkov its teeth) and each test reads
its part of the one report.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.k8s.rendered import K8S_DIR, LWS_KIND, Renders, lws_templates, overlay_names
from tests.k8s.tools import run_tool

CONFIG = K8S_DIR / ".checkov.yaml"
BAD_EXAMPLE = "zz-deliberately-bad.yaml"
# A privileged root container from `latest`, without limits or probes.
BAD_MANIFEST = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: bad, namespace: qwen-serving}
spec:
  replicas: 1
  selector: {matchLabels: {app: bad}}
  template:
    metadata: {labels: {app: bad}}
    spec:
      containers:
        - name: bad
          image: nginx:latest
          securityContext: {privileged: true, allowPrivilegeEscalation: true, runAsUser: 0}
"""
# What no config for this project may skip, and the bad manifest must therefore fail:
# privileged (16), privilege escalation (20), root (23), `latest` (14), memory limits (13),
# readiness (9) and liveness (8) probes.
MUST_BITE = {
    "CKV_K8S_16",
    "CKV_K8S_20",
    "CKV_K8S_23",
    "CKV_K8S_14",
    "CKV_K8S_13",
    "CKV_K8S_9",
    "CKV_K8S_8",
}
SKIP_KEY = "skip-check"
LWS_POD_NAMES = ("engine-leader", "engine-worker")


@dataclass(frozen=True)
class Report:
    failed: list[dict[str, Any]]
    passed: list[dict[str, Any]]
    output: str

    def for_file(self, name: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        def mine(checks: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return [c for c in checks if Path(c["file_path"]).name == name]

        return mine(self.failed), mine(self.passed)


def checkov(files: list[Path], config: Path) -> Report:
    done = run_tool(
        "checkov",
        "--config-file",
        config,
        "--framework",
        "kubernetes",
        "--skip-download",
        "--output",
        "json",
        "--file",
        *files,
    )
    try:
        data = json.loads(done.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"checkov gave no JSON (exit {done.returncode}):\n{done.stdout}\n{done.stderr}")
    reports = data if isinstance(data, list) else [data]
    results = [r.get("results", {}) for r in reports]
    return Report(
        failed=[c for r in results for c in r.get("failed_checks", [])],
        passed=[c for r in results for c in r.get("passed_checks", [])],
        output=done.stderr,
    )


def config_text() -> str:
    if not CONFIG.is_file():
        pytest.fail(f"{CONFIG} is missing")
    return CONFIG.read_text(encoding="utf-8")


def skipped_checks() -> list[tuple[str, str]]:
    """(check id, its justification) for each skip in k8s/.checkov.yaml: the comment on the
    skip's line or, failing that, the comment line(s) right above it."""
    lines = config_text().splitlines()
    skips = yaml.safe_load("\n".join(lines)).get(SKIP_KEY) or []
    found = []
    for index, line in enumerate(lines):
        item = re.match(r"\s*-\s*([A-Z0-9_]+)\s*(?:#\s*(.*))?$", line)
        if not item or item.group(1) not in skips:
            continue
        reason = item.group(2) or ""
        above = index - 1
        while not reason and above >= 0 and lines[above].strip().startswith("#"):
            reason = lines[above].strip().lstrip("#").strip() + " " + reason
            above -= 1
        found.append((item.group(1), reason.strip()))
    assert sorted(check for check, _ in found) == sorted(skips), (
        f"{CONFIG}: write {SKIP_KEY} as a block list, one check per line"
    )
    return found


def renders_and_bad_example(renders: Renders, directory: Path) -> list[Path]:
    files = []
    for overlay in overlay_names():
        try:
            path = renders.write(overlay, directory)
        except pytest.fail.Exception:
            continue  # test_overlay_renders says why; the others still get checked
        # checkov knows no LeaderWorkerSet: its pod templates are checked as the Pods they make.
        pods = [
            {"apiVersion": "v1", "kind": "Pod", "metadata": {**obj["metadata"], "name": name},
             "spec": template["spec"]}
            for obj in renders(overlay).of_kind(LWS_KIND)
            for name, template in zip(LWS_POD_NAMES, lws_templates(obj), strict=True)
        ]  # fmt: skip
        if pods:
            with path.open("a", encoding="utf-8") as out:
                out.write("---\n" + yaml.safe_dump_all(pods, sort_keys=False))
        files.append(path)
    bad = directory / BAD_EXAMPLE
    bad.write_text(BAD_MANIFEST, encoding="utf-8")
    return [*files, bad]


@pytest.fixture(scope="module")
def report(renders: Renders, tmp_path_factory: pytest.TempPathFactory) -> Report:
    config_text()
    directory = tmp_path_factory.mktemp("checkov")
    return checkov(renders_and_bad_example(renders, directory), CONFIG)


@pytest.fixture(scope="module")
def unskipped(renders: Renders, tmp_path_factory: pytest.TempPathFactory) -> Report:
    """The same run with the config's skips removed: what each skip hides."""
    directory = tmp_path_factory.mktemp("checkov-unskipped")
    config: dict[str, Any] = yaml.safe_load(config_text())
    config.pop(SKIP_KEY, None)
    path = directory / "config.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return checkov(renders_and_bad_example(renders, directory), path)


@pytest.mark.parametrize("overlay", overlay_names())
def test_checkov_passes(renders: Renders, report: Report, overlay: str) -> None:
    renders(overlay)  # a render that failed fails here, with kubectl's message
    failed, passed = report.for_file(f"{overlay}.yaml")
    assert passed, f"checkov checked nothing in {overlay}:\n{report.output}"
    assert not failed, f"{overlay}:\n" + "\n".join(
        f"{c['check_id']} {c['resource']}: {c['check_name']}" for c in failed
    )


def test_the_config_leaves_checkov_its_teeth(report: Report) -> None:
    failed, _ = report.for_file(BAD_EXAMPLE)
    missing = MUST_BITE - {c["check_id"] for c in failed}
    assert not missing, f"{CONFIG} (or checkov) no longer catches {sorted(missing)}"


def test_every_skip_is_justified() -> None:
    for check, reason in skipped_checks():
        assert len(reason.split()) >= 4, f"{CONFIG}: say why {check} is skipped, in a comment"


@pytest.mark.parametrize("overlay", overlay_names())
def test_every_inline_skip_is_justified(renders: Renders, overlay: str) -> None:
    """checkov.io/skipN annotations skip one check on one object: `CKV_ID=why`."""
    for obj in renders(overlay).objects:
        for key, value in (obj["metadata"].get("annotations") or {}).items():
            if key.startswith("checkov.io/skip"):
                check, _, reason = str(value).partition("=")
                where = f"{overlay} {obj['kind']}/{obj['metadata']['name']} {key}"
                assert re.fullmatch(r"CKV2?_[A-Z0-9_]+", check.strip()), where
                assert len(reason.split()) >= 4, f"{where}: say why after `{check}=`"


def test_every_skip_is_needed(unskipped: Report) -> None:
    renders_failing = {
        c["check_id"] for c in unskipped.failed if Path(c["file_path"]).name != BAD_EXAMPLE
    }
    unneeded = [check for check, _ in skipped_checks() if check not in renders_failing]
    assert not unneeded, f"{CONFIG} skips checks no overlay fails: {unneeded}"
