"""The Dockerfile: hadolint clean, pinned bases, shipped stages non-root and free of compilers.

The shipped targets are the ones the manifests run (`gateway`, `model-builder`) and the
file's last stage (what a plain `docker build .` makes). A stage inherits what the stages it
is built FROM did (their USER, their packages), so each check walks that chain.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import pytest

from tests.k8s.rendered import image_tag
from tests.k8s.tools import ROOT, run_tool

DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
HADOLINT_CONFIG = ROOT / ".hadolint.yaml"
TARGETS = ("gateway", "model-builder")
COMPILERS = re.compile(r"(?<![\w.-])(gcc|g\+\+|clang|build-essential|rustc|cargo)(?![\w.-])")
ROOT_USERS = {"root", "0"}
# What the build context must leave out: the venvs (gigabytes, and this machine's paths)
# and var/ (models, logs, API keys).
MUST_IGNORE = (".venv", "var")


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)


def logical_lines(text: str) -> list[str]:
    """Instructions with continuations joined; comments and blank lines dropped."""
    lines: list[str] = []
    current = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        lines.append(current + stripped)
        current = ""
    if current:
        lines.append(current)
    return lines


def substitute(value: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), value)


def stages() -> list[Stage]:
    if not DOCKERFILE.is_file():
        pytest.fail(f"{DOCKERFILE} is missing")
    found: list[Stage] = []
    global_args: dict[str, str] = {}
    for line in logical_lines(DOCKERFILE.read_text(encoding="utf-8")):
        instruction, _, rest = line.partition(" ")
        instruction, rest = instruction.upper(), rest.strip()
        if instruction == "ARG" and not found:
            name, _, default = rest.partition("=")
            global_args[name.strip()] = default.strip().strip('"')
        elif instruction == "FROM":
            words = [w for w in rest.split() if not w.startswith("--")]
            base = substitute(words[0], global_args)
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else str(len(found))
            found.append(Stage(name=name, base=base))
        elif found:
            found[-1].instructions.append((instruction, rest))
    assert found, f"{DOCKERFILE} has no FROM"
    return found


def chain(name: str) -> list[Stage]:
    """The stage and the stages it is built from, nearest first."""
    by_name = {stage.name: stage for stage in stages()}
    assert name in by_name, f"{DOCKERFILE} has no stage {name}; it has {sorted(by_name)}"
    out = [by_name[name]]
    while out[-1].base in by_name and by_name[out[-1].base] not in out:
        out.append(by_name[out[-1].base])
    return out


def shipped() -> list[str]:
    return sorted({*TARGETS, stages()[-1].name})


def test_hadolint_passes() -> None:
    assert DOCKERFILE.is_file(), f"{DOCKERFILE} is missing"
    config = ["--config", str(HADOLINT_CONFIG)] if HADOLINT_CONFIG.is_file() else []
    done = run_tool("hadolint", *config, "--format", "json", DOCKERFILE)
    findings = json.loads(done.stdout or "[]")
    assert not findings and done.returncode == 0, (
        "\n".join(
            f"Dockerfile:{f['line']} {f['code']} ({f['level']}): {f['message']}" for f in findings
        )
        or done.stderr
    )


def test_every_hadolint_ignore_is_justified() -> None:
    lines = DOCKERFILE.read_text(encoding="utf-8").splitlines()
    for index, line in enumerate(lines):
        if "hadolint ignore" in line:
            above = lines[index - 1].strip() if index else ""
            assert above.startswith("#") and "hadolint" not in above, (
                f"Dockerfile:{index + 1}: say why above `{line.strip()}`"
            )
    if HADOLINT_CONFIG.is_file():
        config = HADOLINT_CONFIG.read_text(encoding="utf-8").splitlines()
        for index, line in enumerate(config):
            rule = re.match(r"\s*-\s*(DL\d+|SC\d+)\s*(#.*)?$", line)
            if rule and not rule.group(2):
                assert index and config[index - 1].strip().startswith("#"), (
                    f"{HADOLINT_CONFIG}:{index + 1}: say why {rule.group(1)} is ignored"
                )


def test_base_images_are_pinned() -> None:
    names = {stage.name for stage in stages()}
    for stage in stages():
        if stage.base in names or stage.base == "scratch":
            continue
        assert "$" not in stage.base, f"FROM {stage.base}: give the ARG a default"
        tag, digest = image_tag(stage.base)
        assert tag or digest, f"FROM {stage.base}: pin a version or a digest"
        assert tag != "latest", f"FROM {stage.base}: no `latest`"
    text = "\n".join(logical_lines(DOCKERFILE.read_text(encoding="utf-8")))
    assert not re.search(r":latest\b", text), "no `latest` in the Dockerfile"


@pytest.mark.parametrize("target", TARGETS)
def test_the_targets_the_manifests_run_exist(target: str) -> None:
    assert chain(target)


def test_shipped_stages_run_as_non_root() -> None:
    for name in shipped():
        # the nearest stage's last USER wins; without one the base image's root stays
        users = [
            rest
            for stage in chain(name)
            for inst, rest in reversed(stage.instructions)
            if inst == "USER"
        ]
        assert users, f"stage {name} never sets USER: it would run as root"
        user = users[0].split(":")[0].strip()
        assert user not in ROOT_USERS, f"stage {name} runs as {user}"


def test_shipped_stages_install_no_compilers() -> None:
    for name in shipped():
        for stage in chain(name):
            for inst, rest in stage.instructions:
                if inst == "RUN":
                    found = COMPILERS.findall(rest)
                    assert not found, f"stage {name} (via {stage.name}) installs {found}: {rest}"


def test_dockerignore_keeps_venvs_and_state_out() -> None:
    assert DOCKERIGNORE.is_file(), f"{DOCKERIGNORE} is missing"
    entries = [
        line.strip().rstrip("/").removeprefix("**/")
        for line in DOCKERIGNORE.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for name in MUST_IGNORE:
        # the last pattern that matches decides (Docker's rule): the name itself, `*`, or a
        # `!` exception that lets it back in
        verdict = [e for e in entries if e.lstrip("!") in (name, "*")]
        assert verdict and not verdict[-1].startswith("!"), f"{DOCKERIGNORE} lets {name} in"
