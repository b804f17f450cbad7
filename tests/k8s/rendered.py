"""Overlays rendered with `kubectl kustomize` and parsed: the objects the k8s tests inspect.

    renders = Renders()                 # the session fixture `renders` (conftest.py) holds one
    rendered = renders("cpu-demo")      # kubectl kustomize k8s/overlays/cpu-demo, once
    rendered.one("Deployment", "engine"); rendered.of_kind("Service"); rendered.pod_specs()
    image_mappings()                    # placeholder -> pinned image (k8s/components/images)
    gateway_env(rendered); job_of(rendered, monitor); selects(policy, labels)

A render that fails fails the test asking for it, with kubectl's message.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.k8s.tools import ROOT, run_tool

K8S_DIR = ROOT / "k8s"
OVERLAYS_DIR = K8S_DIR / "overlays"
IMAGES_DIR = K8S_DIR / "components" / "images"
# The overlays the issue asks for; any other directory under k8s/overlays is tested too.
EXPECTED_OVERLAYS = (
    "cpu-demo",
    "gpu-128k",
    "gpu-27b-awq-tp4",
    "gpu-4x24gb-fp16",
    "gpu-72b-multinode",
    "gpu-awq-1x24gb",
)
# LeaderWorkerSet (a model across nodes): the leader's pod template stands for the workload
# where one pod spec is asked for; pod_specs() yields the workers' template too. The LWS
# controller labels every pod of a set with this label and the set's name.
LWS_KIND = "LeaderWorkerSet"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
NAMESPACE = "qwen-serving"
PART_OF = {"app.kubernetes.io/part-of": "qwen-serving"}

Obj = dict[str, Any]


def overlay_dirs() -> list[str]:
    """The directories under k8s/overlays (whatever is there, kustomization or not)."""
    if not OVERLAYS_DIR.is_dir():
        return []
    return sorted(path.name for path in OVERLAYS_DIR.iterdir() if path.is_dir())


def overlay_names() -> list[str]:
    """Every overlay to test: those present and those expected (a missing one then fails
    its tests instead of the parametrization coming up empty and skipping them)."""
    return sorted(set(overlay_dirs()) | set(EXPECTED_OVERLAYS))


def pod_spec(obj: Obj) -> Obj | None:
    """The pod spec a workload runs, or None for objects that run no pods."""
    spec: Obj = obj.get("spec") or {}
    kind = obj.get("kind")
    if kind == "Pod":
        return spec
    if kind == "CronJob":
        job: Obj = spec.get("jobTemplate", {}).get("spec", {})
        return pod_spec({"kind": "Job", "spec": job})
    if kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"):
        template: Obj | None = spec.get("template", {}).get("spec")
        return template
    if kind == LWS_KIND:
        return lws_templates(obj)[0]["spec"]  # type: ignore[no-any-return]
    return None


def lws_templates(obj: Obj) -> list[Obj]:
    """A LeaderWorkerSet's pod templates: the leader's (or the workers' when there is no
    separate leader template), then the workers'."""
    lwt: Obj = obj["spec"]["leaderWorkerTemplate"]
    worker: Obj = lwt["workerTemplate"]
    return [lwt.get("leaderTemplate") or worker, worker]


def containers(spec: Obj, *, init: bool = True) -> list[Obj]:
    found: list[Obj] = list(spec.get("containers") or [])
    if init:
        found = list(spec.get("initContainers") or []) + found
    return found


def labels_match(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def image_tag(image: str) -> tuple[str | None, str | None]:
    """(tag, digest) of an image reference, each None when absent."""
    image, _, digest = image.partition("@")
    last = image.rsplit("/", 1)[-1]
    return (last.split(":", 1)[1] if ":" in last else None), (digest or None)


def image_mappings() -> dict[str, str]:
    """Placeholder -> the image k8s/components/images maps it to (kustomize's `images:`
    field or ImageTagTransformer objects): the one place images are chosen."""
    entries: list[Obj] = []
    for path in sorted(IMAGES_DIR.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if doc:
                entries.extend(doc.get("images") or [])
                if doc.get("kind") == "ImageTagTransformer":
                    entries.append(doc["imageTag"])
    assert entries, f"{IMAGES_DIR} maps no images"
    mapped: dict[str, str] = {}
    for entry in entries:
        name = str(entry["name"])
        reference = str(entry.get("newName", name))
        if "newTag" in entry:
            reference += f":{entry['newTag']}"
        if "digest" in entry:
            reference += f"@{entry['digest']}"
        assert name not in mapped, f"{IMAGES_DIR} maps {name} twice"
        mapped[name] = reference
    return mapped


@dataclass(frozen=True)
class Rendered:
    overlay: str
    text: str
    objects: tuple[Obj, ...]

    def of_kind(self, kind: str) -> list[Obj]:
        return [obj for obj in self.objects if obj.get("kind") == kind]

    def find(self, kind: str, name: str) -> Obj | None:
        for obj in self.of_kind(kind):
            if obj.get("metadata", {}).get("name") == name:
                return obj
        return None

    def one(self, kind: str, name: str) -> Obj:
        found = self.find(kind, name)
        if found is None:
            have = sorted(
                f"{o.get('kind')}/{o.get('metadata', {}).get('name')}" for o in self.objects
            )
            pytest.fail(f"{self.overlay}: no {kind}/{name} in the render; it has {have}")
        return found

    def pod_specs(self) -> Iterator[tuple[Obj, Obj]]:
        """(workload, its pod spec) for every object that runs pods."""
        for obj in self.objects:
            if obj.get("kind") == LWS_KIND:
                for template in lws_templates(obj):
                    yield obj, template["spec"]
                continue
            spec = pod_spec(obj)
            if spec is not None:
                yield obj, spec

    def container(self, kind: str, workload: str, name: str) -> Obj:
        spec = pod_spec(self.one(kind, workload)) or {}
        for item in containers(spec):
            if item.get("name") == name:
                return item
        pytest.fail(f"{self.overlay}: {kind}/{workload} has no container {name}")


def render(overlay: str) -> Rendered:
    path = OVERLAYS_DIR / overlay
    if not (path / "kustomization.yaml").is_file():
        pytest.fail(f"{path}/kustomization.yaml is missing")
    done = run_tool("kubectl", "kustomize", path)
    if done.returncode != 0:
        pytest.fail(f"kubectl kustomize {path} failed:\n{done.stderr}", pytrace=False)
    objects = tuple(obj for obj in yaml.safe_load_all(done.stdout) if obj)
    return Rendered(overlay=overlay, text=done.stdout, objects=objects)


@dataclass
class Renders:
    """Each overlay rendered at most once per session (kubectl takes a moment each)."""

    cache: dict[str, Rendered] = field(default_factory=dict)

    def __call__(self, overlay: str) -> Rendered:
        if overlay not in self.cache:
            self.cache[overlay] = render(overlay)
        return self.cache[overlay]

    def write(self, overlay: str, directory: Path) -> Path:
        """The render as a file, for tools that read files."""
        path = directory / f"{overlay}.yaml"
        path.write_text(self(overlay).text, encoding="utf-8")
        return path


# What the rendered objects mean, for the policy tests.


def pod_labels(workload: Obj) -> dict[str, str]:
    """The labels of a workload's pods (a LeaderWorkerSet: its leader's, and the set's name
    label the controller adds to every pod of the set)."""
    if workload.get("kind") == LWS_KIND:
        leader = lws_templates(workload)[0]["metadata"].get("labels", {})
        return {**leader, LWS_NAME_LABEL: workload["metadata"]["name"]}
    labels: dict[str, str] = workload["spec"]["template"]["metadata"].get("labels", {})
    return labels


def gateway_env(rendered: Rendered) -> dict[str, str]:
    """The gateway container's environment: its ConfigMaps' data, literal values, and a
    stand-in for each Secret value."""
    container = rendered.container("Deployment", "gateway", "gateway")
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        ref = source.get("configMapRef")
        assert ref, f"gateway envFrom {source}: settings come from ConfigMaps"
        env.update(rendered.one("ConfigMap", ref["name"]).get("data") or {})
    for item in container.get("env") or []:
        secret = (item.get("valueFrom") or {}).get("secretKeyRef")
        if "value" in item:
            env[item["name"]] = str(item["value"])
        elif secret and secret["name"] == "redis":
            env[item["name"]] = "redis://:password@redis:6379/0"
    return env


def selects(policy: Obj, labels: dict[str, str]) -> bool:
    """Whether a NetworkPolicy applies to pods with these labels."""
    selector = policy["spec"].get("podSelector") or {}
    assert not selector.get("matchExpressions"), policy["metadata"]["name"]
    return labels_match(selector.get("matchLabels") or {}, labels)


def restricts_ingress(policy: Obj) -> bool:
    return "Ingress" in policy["spec"].get("policyTypes", ["Ingress"])


def job_of(rendered: Rendered, monitor: Obj) -> str:
    """The `job` label prometheus-operator gives a monitor's targets."""
    spec = monitor["spec"]
    endpoints = spec.get("endpoints") or spec.get("podMetricsEndpoints") or []
    for endpoint in endpoints:
        for relabel in endpoint.get("relabelings") or []:
            if (
                relabel.get("targetLabel") == "job"
                and relabel.get("action", "replace") == "replace"
            ):
                return str(relabel["replacement"])
    selector = spec["selector"]["matchLabels"]
    if monitor["kind"] == "ServiceMonitor":
        [service] = [
            s
            for s in rendered.of_kind("Service")
            if labels_match(selector, s["metadata"].get("labels", {}))
        ]
        if spec.get("jobLabel"):
            return str(service["metadata"]["labels"][spec["jobLabel"]])
        return str(service["metadata"]["name"])
    if spec.get("jobLabel"):
        matching = [w for w, _ in rendered.pod_specs() if labels_match(selector, pod_labels(w))]
        [workload] = list({id(w): w for w in matching}.values())  # an LWS yields two specs
        return str(pod_labels(workload)[spec["jobLabel"]])
    return f"{monitor['metadata']['namespace']}/{monitor['metadata']['name']}"
