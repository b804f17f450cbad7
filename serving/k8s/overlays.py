"""Which profile each kustomize overlay deploys, and keeping their generated patches current.

    write_overlays(root)   # render every k8s/overlays/<overlay>/engine.generated.yaml
    stale_overlays(root)   # overlays whose committed file differs from its profile's render

The map is the one place an overlay meets a profile: change a profile (or point an overlay at
another) and `serving k8s render --all` rewrites the patch; `--check` and the tests fail until
it has.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from serving.k8s.engine_patch import render_patch
from serving.k8s.leaderworkerset import render_leaderworkerset
from serving.profiles.loader import load_profile

# Overlay directory -> profile name (or YAML path) it deploys.
OVERLAYS: dict[str, str] = {
    "gpu-4x24gb-fp16": "qwen2.5-7b-fp16-tp4-4090",
    "gpu-awq-1x24gb": "qwen2.5-7b-awq-4090",
    "gpu-128k": "qwen3.5-9b-128k-tp4",
    "gpu-27b-awq-tp4": "qwen3.5-27b-awq-tp4",
    "cpu-demo": "cpu-tiny",
    "gpu-72b-multinode": "qwen2.5-72b-pp2-tp4-2x4090x4",
}
OVERLAYS_DIR = Path("k8s") / "overlays"
GENERATED_NAME = "engine.generated.yaml"
# A profile across several nodes also gets its engine as a LeaderWorkerSet, built from the
# base's engine pod.
LWS_NAME = "leaderworkerset.generated.yaml"
BASE_DEPLOYMENT = Path("k8s") / "base" / "engine" / "deployment.yaml"


def generated_path(root: Path, overlay: str) -> Path:
    """Where an overlay's generated engine patch lives under the repository `root`."""
    return root / OVERLAYS_DIR / overlay / GENERATED_NAME


@dataclass(frozen=True)
class Rendered:
    overlay: str
    profile: str
    path: Path
    text: str

    def current(self) -> bool:
        """Whether the file on disk already holds exactly this render."""
        try:
            return self.path.read_text(encoding="utf-8") == self.text
        except (OSError, UnicodeDecodeError):
            return False  # missing or unreadable: as stale as a wrong one


def render_overlays(root: Path, overlays: Mapping[str, str] = OVERLAYS) -> list[Rendered]:
    """Every overlay's generated files as its profile renders them now (nothing written)."""
    found: list[Rendered] = []
    for overlay, name in overlays.items():
        profile = load_profile(name)
        found.append(Rendered(overlay, name, generated_path(root, overlay), render_patch(profile)))
        if profile.nodes > 1:
            base = yaml.safe_load((root / BASE_DEPLOYMENT).read_text(encoding="utf-8"))
            path = generated_path(root, overlay).with_name(LWS_NAME)
            found.append(Rendered(overlay, name, path, render_leaderworkerset(profile, base)))
    return found


def stale_overlays(root: Path, overlays: Mapping[str, str] = OVERLAYS) -> list[Rendered]:
    """Overlays whose committed patch is missing or differs from their profile's render."""
    return [rendered for rendered in render_overlays(root, overlays) if not rendered.current()]


def write_overlays(root: Path, overlays: Mapping[str, str] = OVERLAYS) -> list[Rendered]:
    """Write the patches that changed; returns those (an unchanged file keeps its mtime)."""
    written = stale_overlays(root, overlays)
    for rendered in written:
        rendered.path.parent.mkdir(parents=True, exist_ok=True)
        rendered.path.write_text(rendered.text, encoding="utf-8")
    return written
