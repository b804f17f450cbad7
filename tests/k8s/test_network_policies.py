"""Who reaches whom in every overlay: the engine's ingress, egress (DNS, the gateway's peers,
never the cloud metadata address), the gateway's metrics port, and the headless Service the
gateway discovers the engines through (k8s/README.md, "Network policies", "Engine discovery")."""

from __future__ import annotations

import copy
import ipaddress
import json
import shutil
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from serving.gateway.setting_names import ENV_PREFIX
from tests.k8s.rendered import (
    Obj,
    Rendered,
    Renders,
    gateway_env,
    labels_match,
    pod_labels,
    restricts_ingress,
    selects,
)
from tests.k8s.test_manifests_policy import (
    GATEWAY_PEER,
    NAME,
    OVERLAY_NAMES,
    PROMETHEUS_PEER,
    RAY_GROUP_PEER,
    engine_workload,
    profile_of,
)
from tests.k8s.tools import ROOT, run_tool


@pytest.mark.parametrize("overlay", OVERLAY_NAMES)
def test_only_the_gateway_and_prometheus_reach_the_engine(renders: Renders, overlay: str) -> None:
    rendered = renders(overlay)
    engine_labels = pod_labels(engine_workload(rendered))
    deny = rendered.one("NetworkPolicy", "default-deny-ingress")["spec"]
    assert deny.get("podSelector") in ({}, None) and not deny.get("ingress"), overlay
    assert "Ingress" in deny.get("policyTypes", []), overlay
    policies = [
        p
        for p in rendered.of_kind("NetworkPolicy")
        if selects(p, engine_labels) and restricts_ingress(p)
    ]
    peers = []
    for policy in policies:
        for rule in policy["spec"].get("ingress") or []:
            where = f"{overlay} NetworkPolicy/{policy['metadata']['name']}"
            if profile_of(overlay).nodes > 1 and rule.get("from") == [RAY_GROUP_PEER]:
                continue  # its own group, on every port
            assert rule.get("from"), f"{where}: a rule without `from` admits everyone"
            assert rule.get("ports"), f"{where}: a rule without `ports` opens every port"
            assert all(p.get("port") in (8000, "http") for p in rule["ports"]), where
            peers.extend(rule["from"])
    assert GATEWAY_PEER in peers, f"{overlay}: the gateway cannot reach the engine"
    strangers = [peer for peer in peers if peer not in (GATEWAY_PEER, PROMETHEUS_PEER)]
    assert not strangers, f"{overlay}: the engine also admits {strangers}"


def discovery_problems(rendered: Rendered) -> list[str]:
    """Why the gateway would not see every engine pod: its upstream must be a dns+ name of a
    headless Service (one address per ready pod) that selects the engine pods, on their port.
    A ClusterIP Service's name answers one virtual IP: kube-proxy would pick the pod and the
    gateway's routing would see one engine."""
    upstream = gateway_env(rendered).get(f"{ENV_PREFIX}UPSTREAM", "")
    if not upstream.startswith("dns+"):
        return [f"upstream {upstream!r} is not a dns+ (discovered) upstream"]
    parts = urlsplit(upstream.removeprefix("dns+"))
    service = rendered.find("Service", parts.hostname or "")
    if service is None:
        return [f"upstream names no Service of the render ({parts.hostname})"]
    spec, problems = service["spec"], []
    if spec.get("clusterIP") != "None":
        problems.append(f"Service {parts.hostname} is not headless (no clusterIP: None)")
    if not labels_match(spec.get("selector") or {}, pod_labels(engine_workload(rendered))):
        problems.append(f"Service {parts.hostname} does not select the engine pods")
    if parts.port not in [port["port"] for port in spec["ports"]]:
        problems.append(f"Service {parts.hostname} has no port {parts.port}")
    return problems


@pytest.mark.parametrize("overlay", OVERLAY_NAMES)
def test_the_gateway_discovers_the_engine_pods_through_a_headless_service(
    renders: Renders, overlay: str
) -> None:
    assert discovery_problems(renders(overlay)) == [], overlay


def test_a_gateway_pointed_at_a_cluster_ip_service_is_refused(renders: Renders) -> None:
    rendered = copy.deepcopy(renders("cpu-demo"))
    settings = rendered.one("ConfigMap", "gateway-settings")["data"]
    settings[f"{ENV_PREFIX}UPSTREAM"] = "dns+http://engine:8000"  # the ClusterIP Service
    assert discovery_problems(rendered) == ["Service engine is not headless (no clusterIP: None)"]
    settings[f"{ENV_PREFIX}UPSTREAM"] = "http://engine-headless:8000"  # no discovery
    assert discovery_problems(rendered) == [
        "upstream 'http://engine-headless:8000' is not a dns+ (discovered) upstream"
    ]


# -- egress ------------------------------------------------------------------------------

METADATA = ipaddress.ip_address("169.254.169.254")
KUBE_DNS_PEER = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
    "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
}
ENGINE_PEER = {"podSelector": {"matchLabels": {NAME: "engine"}}}
REDIS_PEER = {"podSelector": {"matchLabels": {NAME: "redis"}}}


def egress_rules(rendered: Rendered, labels: dict[str, str]) -> list[Obj]:
    """Every egress rule that admits traffic out of pods with these labels."""
    return [
        rule
        for policy in rendered.of_kind("NetworkPolicy")
        if selects(policy, labels) and "Egress" in policy["spec"].get("policyTypes", [])
        for rule in policy["spec"].get("egress") or []
    ]


def metadata_leaks(rendered: Rendered) -> list[str]:
    """Egress rules through which a pod could reach the cloud metadata address."""
    leaks = []
    for policy in rendered.of_kind("NetworkPolicy"):
        for rule in policy["spec"].get("egress") or []:
            name = policy["metadata"]["name"]
            if not rule.get("to"):
                leaks.append(f"{name}: a rule without `to` admits every address")
            for peer in rule.get("to") or []:
                block = peer.get("ipBlock")
                if block and METADATA in ipaddress.ip_network(block["cidr"]):
                    excepted = block.get("except") or []
                    if not any(METADATA in ipaddress.ip_network(cidr) for cidr in excepted):
                        leaks.append(f"{name}: {block['cidr']} includes {METADATA}")
    return leaks


@pytest.mark.parametrize("overlay", OVERLAY_NAMES)
def test_egress_is_denied_unless_admitted_and_every_pod_may_ask_dns(
    renders: Renders, overlay: str
) -> None:
    rendered = renders(overlay)
    deny = rendered.one("NetworkPolicy", "default-deny-egress")["spec"]
    assert deny.get("podSelector") in ({}, None) and deny["policyTypes"] == ["Egress"], overlay
    assert not deny.get("egress"), overlay
    dns = rendered.one("NetworkPolicy", "egress-dns")["spec"]
    assert dns.get("podSelector") in ({}, None), overlay
    [rule] = dns["egress"]
    assert rule["to"] == [KUBE_DNS_PEER], overlay
    assert {(p["port"], p["protocol"]) for p in rule["ports"]} == {(53, "UDP"), (53, "TCP")}


@pytest.mark.parametrize("overlay", OVERLAY_NAMES)
def test_the_gateway_reaches_the_engines_redis_and_dns_only(renders: Renders, overlay: str) -> None:
    rendered = renders(overlay)
    rules = egress_rules(rendered, pod_labels(rendered.one("Deployment", "gateway")))
    reach = sorted(
        (json.dumps(peer, sort_keys=True), port["port"])
        for rule in rules
        for peer in rule["to"]
        for port in rule["ports"]
    )
    assert reach == sorted(
        (json.dumps(peer, sort_keys=True), port)
        for peer, port in (
            (ENGINE_PEER, 8000),
            (REDIS_PEER, 6379),
            (KUBE_DNS_PEER, 53),
            (KUBE_DNS_PEER, 53),
        )
    ), overlay


@pytest.mark.parametrize("overlay", OVERLAY_NAMES)
def test_no_pod_reaches_the_cloud_metadata_address(renders: Renders, overlay: str) -> None:
    assert metadata_leaks(renders(overlay)) == [], overlay


def test_the_metadata_check_fails_on_an_open_rule(renders: Renders) -> None:
    rendered = copy.deepcopy(renders("cpu-demo"))
    engine = rendered.one("NetworkPolicy", "engine")["spec"]
    engine["egress"][0]["to"][0]["ipBlock"].pop("except")
    rendered.one("NetworkPolicy", "gateway")["spec"]["egress"].append({"ports": [{"port": 443}]})
    assert metadata_leaks(rendered) == [
        "engine: 0.0.0.0/0 includes 169.254.169.254",
        "gateway: a rule without `to` admits every address",
    ]


def test_a_managed_redis_is_reachable_but_not_the_metadata_address(tmp_path: Path) -> None:
    """components/external-redis on top of an overlay (no shipped overlay uses it)."""
    shutil.copytree(ROOT / "k8s", tmp_path / "k8s")
    overlay = tmp_path / "k8s" / "overlays" / "managed-redis"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        "resources: [../cpu-demo]\ncomponents: [../../components/external-redis]\n"
    )
    done = run_tool("kubectl", "kustomize", overlay)
    assert done.returncode == 0, done.stderr
    objects = tuple(obj for obj in yaml.safe_load_all(done.stdout) if obj)
    rendered = Rendered(overlay="managed-redis", text=done.stdout, objects=objects)
    assert rendered.find("StatefulSet", "redis") is None
    assert metadata_leaks(rendered) == []
    ports = {
        port["port"]
        for rule in egress_rules(rendered, pod_labels(rendered.one("Deployment", "gateway")))
        for peer in rule["to"]
        if "ipBlock" in peer
        for port in rule["ports"]
    }
    assert ports == {6379, 6380}


@pytest.mark.parametrize("overlay", OVERLAY_NAMES)
def test_the_gateways_metrics_port_is_prometheus_only(renders: Renders, overlay: str) -> None:
    """Its series name every key with its spend: the API port must not serve them."""
    rendered = renders(overlay)
    metrics_port = int(gateway_env(rendered)[f"{ENV_PREFIX}METRICS_PORT"])
    container = rendered.container("Deployment", "gateway", "gateway")
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {
        "http": 8000,
        "metrics": metrics_port,
    }
    labels = pod_labels(rendered.one("Deployment", "gateway"))
    scraped = False
    for policy in rendered.of_kind("NetworkPolicy"):
        if not (selects(policy, labels) and restricts_ingress(policy)):
            continue
        for rule in policy["spec"].get("ingress") or []:
            ports = {p.get("port") for p in rule.get("ports") or []}
            if metrics_port in ports or "metrics" in ports or not ports:
                assert rule.get("from") == [PROMETHEUS_PEER], (overlay, rule)
                scraped = True
    assert scraped, f"{overlay}: no policy admits Prometheus to the metrics port"
    monitor = rendered.find("ServiceMonitor", "gateway")
    if monitor is None:  # cpu-demo leaves the monitoring component out
        return
    [endpoint] = monitor["spec"]["endpoints"]
    service_ports = {p["name"]: p for p in rendered.one("Service", "gateway")["spec"]["ports"]}
    assert service_ports[endpoint["port"]]["targetPort"] == "metrics", overlay
