"""A model across several machines on Kubernetes: the engine as a LeaderWorkerSet.

    text = render_leaderworkerset(load_profile("qwen2.5-72b-pp2-tp4-2x4090x4"), base)

For a profile with `nodes` > 1 one replica of the model is one LeaderWorkerSet group of
`nodes` pods, one per machine, each with the profile's `gpu_count` GPUs. The leader runs the
Ray head and vLLM's API server (the Service `engine`, the PodMonitor and the NetworkPolicies
select it by `app.kubernetes.io/name: engine`); each worker joins the head with
`ray start --block` and holds its GPUs for vLLM's Ray workers. LeaderWorkerSet's
RecreateGroupOnPodRestart restarts the whole group when any pod of it fails: vLLM cannot lose
a rank and go on.

The pods start from k8s/base's engine pod (security context, probes, preStop drain,
volumes), merged with the profile's engine patch (`engine_patch`), so the single-machine and
the multi-machine engines share one definition; the overlay deletes the base Deployment.
Ray's ports are fixed (RAY_PORT and a block after it), and Ray's token authentication reads
the Secret `ray-auth`: only pods holding it join the cluster.
"""

from __future__ import annotations

import copy
import shlex
from typing import Any

import yaml

from serving.engine.ray_cluster import RayNode, ray_start_argv
from serving.k8s.engine_patch import PROFILE_ANNOTATION, _PlainDumper, engine_patch, header
from serving.k8s.sizing import engine_sizing
from serving.profiles.model import Profile
from serving.vllm_flags import VLLM_SERVER_MODULE

Manifest = dict[str, Any]

LWS_API = "leaderworkerset.x-k8s.io/v1"
NAME_LABEL = "app.kubernetes.io/name"
PART_OF = {"app.kubernetes.io/part-of": "qwen-serving"}
WORKER_NAME = "engine-worker"  # the workers' name label: no Service selects them
RAY_PORT = 6379
RAY_PORT_BLOCK = 6380  # node manager 6380, object manager 6381, ..., workers 6396-6443
RAY_NODE_MANAGER_PORT = RAY_PORT_BLOCK
LEADER_ADDRESS = "${LWS_LEADER_ADDRESS}"  # set by LeaderWorkerSet in every pod of a group
RAY_AUTH_SECRET = "ray-auth"
RAY_AUTH_DIR = "/etc/ray-auth"
RAY_ENV = [
    {"name": "RAY_USAGE_STATS_ENABLED", "value": "0"},
    {"name": "RAY_AUTH_MODE", "value": "token"},
    {"name": "RAY_AUTH_TOKEN_PATH", "value": f"{RAY_AUTH_DIR}/token"},
]
RAY_AUTH_MOUNT = {"name": RAY_AUTH_SECRET, "mountPath": RAY_AUTH_DIR, "readOnly": True}


def merge(base: Any, patch: Any) -> Any:
    """Kubernetes' strategic merge, as far as pod specs need it: maps merge key by key,
    lists of named items merge by name, anything else is replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = dict(base)
        for key, value in patch.items():
            merged[key] = merge(base[key], value) if key in base else value
        return merged
    named = isinstance(base, list) and isinstance(patch, list)
    if named and all(isinstance(item, dict) and "name" in item for item in [*base, *patch]):
        by_name = {item["name"]: item for item in base}
        for item in patch:
            by_name[item["name"]] = merge(by_name.get(item["name"], {}), item)
        return list(by_name.values())
    return copy.deepcopy(patch)


def _shell(argv: list[str]) -> str:
    """A command line for `sh -c`: quoted, except the leader's address, which sh expands."""
    return " ".join(arg if LEADER_ADDRESS in arg else shlex.quote(arg) for arg in argv)


def _ray_argv(node: RayNode, *, block: bool) -> list[str]:
    argv = ray_start_argv(node, python="python3")
    return argv if block else [arg for arg in argv if arg != "--block"]


def _pod(base: Manifest, patch: Manifest) -> Manifest:
    """The engine pod as the single-machine overlay would run it, plus Ray's auth Secret."""
    pod: Manifest = merge(base["spec"]["template"]["spec"], patch)
    secret = {"secretName": RAY_AUTH_SECRET, "items": [{"key": "token", "path": "token"}]}
    pod["volumes"] = [*pod["volumes"], {"name": RAY_AUTH_SECRET, "secret": secret}]
    return pod


def _leader(pod: Manifest) -> Manifest:
    """vLLM's container starts the Ray head, then becomes vLLM (PID 1 gets SIGTERM)."""
    leader = copy.deepcopy(pod)
    [vllm] = [c for c in leader["containers"] if c["name"] == "vllm"]
    head = _ray_argv(RayNode(port=RAY_PORT, port_block=RAY_PORT_BLOCK), block=False)
    script = f'{_shell(head)} && exec python3 -m {VLLM_SERVER_MODULE} "$@"'
    vllm["command"] = ["/bin/sh", "-c", script, "vllm"]
    vllm["env"] = [
        *vllm["env"],
        *RAY_ENV,
        {"name": "RAY_ADDRESS", "value": f"127.0.0.1:{RAY_PORT}"},
    ]
    vllm["volumeMounts"] = [*vllm["volumeMounts"], RAY_AUTH_MOUNT]
    return leader


def _worker(pod: Manifest) -> Manifest:
    """The same pod without vLLM's server: `ray start` joins the leader and holds the GPUs.

    No init containers (the leader's put the weights on the shared volume) and no preStop
    drain (the leader drains); probed on the raylet's port."""
    worker = copy.deepcopy(pod)
    worker.pop("initContainers", None)
    [vllm] = [c for c in worker["containers"] if c["name"] == "vllm"]
    address = f"{LEADER_ADDRESS}:{RAY_PORT}"
    join = _ray_argv(RayNode(address=address, port_block=RAY_PORT_BLOCK), block=True)
    probe = {"tcpSocket": {"port": RAY_NODE_MANAGER_PORT}, "periodSeconds": 20}
    container = {
        "name": "ray-worker",
        "image": vllm["image"],
        "command": ["/bin/sh", "-c", "exec " + _shell(join)],
        "ports": [{"name": "raylet", "containerPort": RAY_NODE_MANAGER_PORT, "protocol": "TCP"}],
        "env": [*vllm["env"], *RAY_ENV],
        "resources": vllm["resources"],
        "securityContext": vllm["securityContext"],
        "volumeMounts": [*vllm["volumeMounts"], RAY_AUTH_MOUNT],
        "readinessProbe": {**probe, "timeoutSeconds": 5, "failureThreshold": 3},
        "livenessProbe": {**probe, "timeoutSeconds": 10, "failureThreshold": 6},
    }
    worker["containers"] = [container]
    return worker


def leaderworkerset(profile: Profile, base_deployment: Manifest) -> Manifest:
    """The LeaderWorkerSet `engine` for a profile with nodes > 1 (`base_deployment`: k8s/base's
    Deployment `engine`, parsed)."""
    deployment, _ = engine_patch(profile)
    pod = _pod(base_deployment, deployment["spec"]["template"]["spec"])
    annotations = {PROFILE_ANNOTATION: profile.name}

    def template(name: str, spec: Manifest) -> Manifest:
        labels = {NAME_LABEL: name, **PART_OF}
        return {"metadata": {"labels": labels, "annotations": annotations}, "spec": spec}

    return {
        "apiVersion": LWS_API,
        "kind": "LeaderWorkerSet",
        "metadata": {"name": "engine", "labels": {NAME_LABEL: "engine"}},
        # No `replicas`: KEDA scales the groups (replicas x nodes machines).
        "spec": {
            "leaderWorkerTemplate": {
                "size": profile.nodes,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": template("engine", _leader(pod)),
                "workerTemplate": template(WORKER_NAME, _worker(pod)),
            },
        },
    }


def render_leaderworkerset(profile: Profile, base_deployment: Manifest) -> str:
    """The file `k8s/overlays/<overlay>/leaderworkerset.generated.yaml` holds, byte for byte."""
    body = yaml.dump(
        leaderworkerset(profile, base_deployment), Dumper=_PlainDumper, sort_keys=False, width=4096
    )
    return "\n".join(header(profile, engine_sizing(profile))) + "\n" + body
