"""k8s/components/batches on an overlay without autoscaling (cpu-demo) and one with KEDA
(gpu-awq-1x24gb): the gateway serves the Batch API from PersistentVolumeClaim batch-state,
as exactly one replica that is replaced, not rolled, and that a drain may evict; the
overlays themselves keep two gateways and serve no batches."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from serving.gateway.batches.install import batch_paths
from serving.gateway.setting_names import ENV_PREFIX
from serving.gateway.settings import GatewaySettings
from tests.k8s.rendered import (
    K8S_DIR,
    NAMESPACE,
    OVERLAYS_DIR,
    Rendered,
    Renders,
    gateway_env,
    pod_spec,
)
from tests.k8s.test_manifests_schema import custom, kubernetes_validate
from tests.k8s.tools import run_tool

COMPONENT = K8S_DIR / "components" / "batches"
OVERLAYS = ("cpu-demo", "gpu-awq-1x24gb")


def with_batches(overlay: str, directory: Path) -> Rendered:
    """`overlay` with the component listed last, as k8s/README.md says to (kustomize takes
    only relative paths to other kustomizations)."""
    root = directory / overlay
    root.mkdir()
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": NAMESPACE,
        "resources": [os.path.relpath(OVERLAYS_DIR / overlay, root)],
        "components": [os.path.relpath(COMPONENT, root)],
    }
    (root / "kustomization.yaml").write_text(yaml.safe_dump(kustomization), encoding="utf-8")
    done = run_tool("kubectl", "kustomize", root)
    if done.returncode != 0:
        pytest.fail(f"kubectl kustomize {overlay} + batches failed:\n{done.stderr}", pytrace=False)
    objects = tuple(obj for obj in yaml.safe_load_all(done.stdout) if obj)
    return Rendered(overlay=overlay, text=done.stdout, objects=objects)


def settings_of(
    env: dict[str, str], home: Path, monkeypatch: pytest.MonkeyPatch
) -> GatewaySettings:
    for name in list(os.environ):
        if name.startswith(ENV_PREFIX) or name == "SERVING_API_KEY":
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SERVING_HOME", str(home))
    return GatewaySettings.from_env()


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_gateway_keeps_batches_on_the_claim(
    overlay: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rendered = with_batches(overlay, tmp_path)
    settings = settings_of(gateway_env(rendered), tmp_path, monkeypatch)
    paths = batch_paths(settings)
    assert paths is not None, overlay
    claim = rendered.one("PersistentVolumeClaim", "batch-state")
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert claim["metadata"]["namespace"] == NAMESPACE
    spec = pod_spec(rendered.one("Deployment", "gateway")) or {}
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = rendered.container("Deployment", "gateway", "gateway")["volumeMounts"]
    for path in paths:  # the database and the files' contents, both on the claim
        # The deepest mount above the path holds it (the claim sits inside the state volume).
        above = [m for m in mounts if Path(m["mountPath"]) in Path(path).parents]
        mount = max(above, key=lambda m: len(Path(m["mountPath"]).parts))
        assert volumes[mount["name"]]["persistentVolumeClaim"]["claimName"] == "batch-state"
        assert not mount.get("readOnly"), (overlay, path)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_gateway_is_one_replica_replaced_not_rolled(overlay: str, tmp_path: Path) -> None:
    rendered = with_batches(overlay, tmp_path)
    gateway = rendered.one("Deployment", "gateway")
    assert gateway["spec"]["strategy"] == {"type": "Recreate"}
    bounds = [
        (a["spec"].get("minReplicas", a["spec"].get("minReplicaCount")),
         a["spec"].get("maxReplicas", a["spec"].get("maxReplicaCount")))
        for a in rendered.of_kind("HorizontalPodAutoscaler") + rendered.of_kind("ScaledObject")
        if a["spec"]["scaleTargetRef"]["name"] == "gateway"
    ]  # fmt: skip
    assert bounds == [(1, 1)], (overlay, bounds)
    budget = rendered.one("PodDisruptionBudget", "gateway")["spec"]
    assert "minAvailable" not in budget and budget["maxUnavailable"] == 1


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_render_validates(overlay: str, tmp_path: Path) -> None:
    (tmp_path / "render").mkdir()
    builtin = [obj for obj in with_batches(overlay, tmp_path / "render").objects if not custom(obj)]
    status, lines = kubernetes_validate(builtin, tmp_path)
    problems = [line for line in lines if not line.startswith("INFO ")]
    assert status == 0 and not problems, f"{overlay}:\n" + "\n".join(problems)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_without_the_component_no_overlay_serves_batches(
    renders: Renders, overlay: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two gateways and no shared batch state: the Batch API is not served (404)."""
    settings = settings_of(gateway_env(renders(overlay)), tmp_path, monkeypatch)
    assert batch_paths(settings) is None
    assert renders(overlay).find("PersistentVolumeClaim", "batch-state") is None
