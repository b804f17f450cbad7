"""Every overlay renders, and every object it renders is valid for the API that will get it.

Built-in kinds: kubernetes-validate --strict (unknown fields fail) for two recent Kubernetes
versions. Custom resources (ServiceMonitor, PodMonitor, PrometheusRule, ScaledObject,
LeaderWorkerSet): the
openAPIV3Schema of the CRDs vendored in k8s/crds/<project>-v<version>/, closed against
unknown fields where the API server's strict field validation (kubectl's default) rejects
them, with the CRDs' CEL rules checked by hand (jsonschema cannot evaluate CEL).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft4Validator  # type: ignore[import-untyped]

from tests.k8s.rendered import EXPECTED_OVERLAYS, K8S_DIR, Obj, Renders, overlay_dirs, overlay_names
from tests.k8s.tools import run_tool

KUBERNETES_VERSIONS = ("1.36.0", "1.37.0")
CRDS_DIR = K8S_DIR / "crds"
# The custom resources the GPU overlays must carry (monitoring and KEDA components).
GPU_CUSTOM_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule", "ScaledObject"}

# The CEL rules (x-kubernetes-validations) of the vendored CRDs, as Python: a re-vendored CRD
# with a new rule fails test_every_cel_rule_is_checked until the rule is added here.
CelCheck = Callable[[Obj], bool]
CEL_RULES: dict[str, CelCheck] = {
    # KEDA ScaledObject spec: maxReplicaCount defaults to 100
    "!has(self.minReplicaCount) || self.minReplicaCount <= (has(self.maxReplicaCount) ? "
    "self.maxReplicaCount : 100)": lambda spec: (
        "minReplicaCount" not in spec or spec["minReplicaCount"] <= spec.get("maxReplicaCount", 100)
    ),
}


def closed(schema: Any) -> Any:
    """A CRD's structural schema as JSON Schema that rejects unknown fields where Kubernetes
    does: objects with `properties`, unless x-kubernetes-preserve-unknown-fields keeps them
    or additionalProperties says what else may come. Objects without `properties` (such as
    the root's metadata, which the API server checks itself) stay open."""
    if isinstance(schema, list):
        return [closed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: closed(value) for key, value in schema.items()}
    if "properties" in schema:
        out["properties"] = {name: closed(sub) for name, sub in schema["properties"].items()}
        if "additionalProperties" not in schema and not schema.get(
            "x-kubernetes-preserve-unknown-fields"
        ):
            out["additionalProperties"] = False
    if schema.get("nullable") and "type" in schema:
        out["type"] = [schema["type"], "null"]
    return out


def cel_rules(schema: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], str]]:
    """(path, rule) for each x-kubernetes-validations rule; "[]" in a path means each item."""
    if not isinstance(schema, dict):
        return
    for item in schema.get("x-kubernetes-validations") or []:
        yield path, str(item["rule"])
    for name, sub in (schema.get("properties") or {}).items():
        yield from cel_rules(sub, (*path, name))
    if "items" in schema:
        yield from cel_rules(schema["items"], (*path, "[]"))
    if isinstance(schema.get("additionalProperties"), dict):
        yield from cel_rules(schema["additionalProperties"], (*path, "{}"))


def nodes_at(value: Any, path: tuple[str, ...]) -> Iterator[Any]:
    if not path:
        yield value
        return
    head, rest = path[0], path[1:]
    if head == "[]" and isinstance(value, list):
        for item in value:
            yield from nodes_at(item, rest)
    elif head == "{}" and isinstance(value, dict):
        for item in value.values():
            yield from nodes_at(item, rest)
    elif isinstance(value, dict) and head in value:
        yield from nodes_at(value[head], rest)


class Crd:
    def __init__(self, path: Path, schema: Obj) -> None:
        self.path = path
        self.schema = schema
        self.validator = Draft4Validator(closed(schema))
        self.cel = list(cel_rules(schema))

    def errors(self, obj: Obj) -> list[str]:
        found = [
            f"{'.'.join(map(str, error.absolute_path)) or '<root>'}: {error.message}"
            for error in self.validator.iter_errors(obj)
        ]
        for path, rule in self.cel:
            check = CEL_RULES.get(rule)
            for node in nodes_at(obj, path):
                if check is not None and not check(node):
                    found.append(f"{'.'.join(path)}: CEL rule failed: {rule}")
        return found


@cache
def crds() -> dict[tuple[str, str], Crd]:
    """(apiVersion, kind) -> its schema, from every CRD vendored under k8s/crds."""
    found: dict[tuple[str, str], Crd] = {}
    for path in sorted(CRDS_DIR.glob("*/*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if not doc or doc.get("kind") != "CustomResourceDefinition":
                continue
            spec = doc["spec"]
            for version in spec["versions"]:
                key = (f"{spec['group']}/{version['name']}", spec["names"]["kind"])
                found[key] = Crd(path, version["schema"]["openAPIV3Schema"])
    return found


def kind_name(obj: Obj) -> str:
    return f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"


def custom(obj: Obj) -> bool:
    return (obj.get("apiVersion"), obj.get("kind")) in crds()


def kubernetes_validate(objects: list[Obj], directory: Path) -> tuple[int, list[str]]:
    """kubernetes-validate --strict for every version: (exit status, its output lines)."""
    path = directory / "objects.yaml"
    path.write_text(yaml.safe_dump_all(objects, sort_keys=False), encoding="utf-8")
    versions = [arg for version in KUBERNETES_VERSIONS for arg in ("-k", version)]
    done = run_tool("kubernetes-validate", "--strict", *versions, path)
    return done.returncode, (done.stdout + done.stderr).splitlines()


def test_the_expected_overlays_exist() -> None:
    present = overlay_dirs()
    missing = [name for name in EXPECTED_OVERLAYS if name not in present]
    assert not missing, f"k8s/overlays lacks {missing}; it has {present}"


@pytest.mark.parametrize("overlay", overlay_names())
def test_overlay_renders(renders: Renders, overlay: str) -> None:
    rendered = renders(overlay)
    assert rendered.objects, f"{overlay} renders nothing"
    names = [kind_name(obj) for obj in rendered.objects]
    assert all(
        obj.get("apiVersion") and obj.get("metadata", {}).get("name") for obj in rendered.objects
    )
    assert len(names) == len(set(names)), f"{overlay}: duplicate objects in {sorted(names)}"


@pytest.mark.parametrize("overlay", overlay_names())
def test_builtin_objects_validate_for_two_kubernetes_versions(
    renders: Renders, overlay: str, tmp_path: Path
) -> None:
    builtin = [obj for obj in renders(overlay).objects if not custom(obj)]
    assert builtin
    status, lines = kubernetes_validate(builtin, tmp_path)
    # Anything but a pass fails: ERROR lines, and WARN lines (no schema: a kind that is
    # neither built in nor one of the vendored CRDs, so nothing would have checked it).
    problems = [line for line in lines if not line.startswith("INFO ")]
    assert status == 0 and not problems, f"{overlay}:\n" + "\n".join(problems)
    for version in KUBERNETES_VERSIONS:
        minor = version.rsplit(".", 1)[0]
        passed = [line for line in lines if line.endswith(f"against version {minor}")]
        assert len(passed) == len(builtin), (overlay, version, len(passed), len(builtin))


DEPLOYMENT = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: example}
spec:
  replicas: 2
  selector: {matchLabels: {app: example}}
  template:
    metadata: {labels: {app: example}}
    spec:
      containers: [{name: c, image: "example:1"}]
"""


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda o: None, None),
        (lambda o: o["spec"].update(replicas="two"), "spec.replicas: 'two' is not of type"),
        (
            lambda o: o["spec"]["template"]["spec"]["containers"][0].update(imagePullPolicie=1),
            "'imagePullPolicie' was unexpected",
        ),
    ],
)
def test_kubernetes_validate_bites(
    change: Callable[[Obj], object], expected: str | None, tmp_path: Path
) -> None:
    deployment = yaml.safe_load(DEPLOYMENT)
    change(deployment)
    status, lines = kubernetes_validate([deployment], tmp_path)
    if expected is None:
        assert status == 0 and len(lines) == len(KUBERNETES_VERSIONS), lines
        assert all(line.startswith("INFO ") for line in lines), lines
    else:
        errors = [line for line in lines if line.startswith("ERROR") and expected in line]
        assert status != 0 and len(errors) == len(KUBERNETES_VERSIONS), lines


def test_the_generated_monitoring_objects_validate(tmp_path: Path) -> None:
    """The generator's output on its own, whichever overlays include it."""
    generated = K8S_DIR / "components" / "monitoring" / "generated"
    objects = [
        doc
        for path in sorted(generated.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8"))
        if doc
    ]
    rules = [obj for obj in objects if custom(obj)]
    assert [kind_name(obj) for obj in rules] == ["PrometheusRule/qwen-serving"]
    assert crds()[(rules[0]["apiVersion"], "PrometheusRule")].errors(rules[0]) == []
    status, lines = kubernetes_validate([obj for obj in objects if not custom(obj)], tmp_path)
    assert status == 0 and all(line.startswith("INFO ") for line in lines), lines


def test_crds_are_vendored_with_their_version() -> None:
    assert crds(), f"no CRDs under {CRDS_DIR}"
    for crd in crds().values():
        match = re.fullmatch(r"([a-z-]+)-v(\d+\.\d+\.\d+)", crd.path.parent.name)
        assert match, f"{crd.path.parent}: name it <project>-v<version>"
        text = crd.path.read_text(encoding="utf-8")
        operator = re.search(r"operator\.prometheus\.io/version: (\S+)", text)
        if operator:
            assert operator.group(1) == match.group(2), crd.path


def test_every_cel_rule_is_checked() -> None:
    rules = {rule for crd in crds().values() for _, rule in crd.cel}
    assert rules <= CEL_RULES.keys(), (
        f"CEL rules without a Python check: {rules - CEL_RULES.keys()}"
    )


@pytest.mark.parametrize("overlay", overlay_names())
def test_custom_resources_validate_against_the_vendored_crds(
    renders: Renders, overlay: str
) -> None:
    objects = [obj for obj in renders(overlay).objects if custom(obj)]
    if overlay.startswith("gpu-"):
        kinds = {obj["kind"] for obj in objects}
        assert kinds >= GPU_CUSTOM_KINDS, f"{overlay} lacks {GPU_CUSTOM_KINDS - kinds}"
    failures = {
        kind_name(obj): errors
        for obj in objects
        if (errors := crds()[(obj["apiVersion"], obj["kind"])].errors(obj))
    }
    assert not failures, f"{overlay}: {failures}"


SERVICE_MONITOR = """
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata: {name: gateway}
spec:
  selector: {matchLabels: {app.kubernetes.io/name: gateway}}
  endpoints: [{port: http, path: /metrics, interval: 15s}]
"""
SCALED_OBJECT = """
apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata: {name: engine}
spec:
  scaleTargetRef: {name: engine}
  minReplicaCount: 1
  maxReplicaCount: 4
  triggers:
    - type: prometheus
      metadata: {serverAddress: "http://prometheus:9090", query: "1", threshold: "1"}
"""

LEADER_WORKER_SET = """
apiVersion: leaderworkerset.x-k8s.io/v1
kind: LeaderWorkerSet
metadata: {name: engine}
spec:
  leaderWorkerTemplate:
    size: 2
    restartPolicy: RecreateGroupOnPodRestart
    workerTemplate:
      spec:
        containers: [{name: c, image: "example:1"}]
"""


@pytest.mark.parametrize(
    ("document", "change", "expected"),
    [
        (SERVICE_MONITOR, lambda o: None, None),
        (SERVICE_MONITOR, lambda o: o["spec"].update(endpoints="x"), "spec.endpoints"),
        (SERVICE_MONITOR, lambda o: o["spec"].update(endpoint=[]), "spec: Additional"),
        (SERVICE_MONITOR, lambda o: o["spec"]["endpoints"][0].update(port=8000), "port"),
        (SERVICE_MONITOR, lambda o: o["spec"].pop("selector"), "'selector' is a required"),
        (SCALED_OBJECT, lambda o: None, None),
        (SCALED_OBJECT, lambda o: o["spec"].update(minReplicaCount=5), "CEL rule failed"),
        (SCALED_OBJECT, lambda o: o["spec"]["triggers"][0].pop("type"), "'type' is a required"),
        (LEADER_WORKER_SET, lambda o: None, None),
        (
            LEADER_WORKER_SET,
            lambda o: o["spec"]["leaderWorkerTemplate"].update(size="two"),
            "leaderWorkerTemplate.size",
        ),
        (
            LEADER_WORKER_SET,
            lambda o: o["spec"]["leaderWorkerTemplate"].update(restartPolicy="Always"),
            "is not one of",
        ),
        (
            LEADER_WORKER_SET,
            lambda o: o["spec"]["leaderWorkerTemplate"].update(groupSize=2),
            "Additional properties",
        ),
    ],
)
def test_the_crd_validation_bites(
    document: str, change: Callable[[Obj], object], expected: str | None
) -> None:
    obj = yaml.safe_load(document)
    change(obj)
    errors = crds()[(obj["apiVersion"], obj["kind"])].errors(obj)
    if expected is None:
        assert errors == []
    else:
        assert any(expected in error for error in errors), errors
