"""The engine's per-overlay patch, generated from a profile: the same file the launcher reads.

    text = render_patch(load_profile("qwen2.5-7b-fp16-tp4-4090"))

`k8s/base` holds what every engine pod shares (volumes, mounts, probes, preStop, security);
this strategic-merge patch of Deployment `engine` (and of PVC `model-cache`'s size) adds what
a profile decides: vLLM's args and env, the image, resources, /dev/shm, the startup budget,
GPU placement and the init container that puts the weights on the PVC. vLLM's flags come only
from `serving.vllm_flags`, so a profile and its manifest cannot disagree on a flag name.
"""

from __future__ import annotations

from typing import Any

import yaml

from serving.engine.hf_cache import is_hub_name
from serving.errors import ServingError
from serving.k8s.sizing import STARTUP_PERIOD_S, EngineSizing, engine_sizing
from serving.models.tiny_model import MODEL_NAME as TINY_MODEL
from serving.planner.gpus import GiB, MiB
from serving.profiles.model import Profile
from serving.vllm_flags import engine_args, engine_env

Manifest = dict[str, Any]

# All interfaces: the Service, the probes and Prometheus reach the pod IP; port 8000 is the
# base container's `http` port.
ENGINE_HOST = "0.0.0.0"
POD_ENGINE_PORT = 8000
MODELS_DIR = "/models"  # PVC `model-cache`, mounted by the base Deployment
HF_HOME = f"{MODELS_DIR}/hf"  # where hub weights are fetched, and vLLM finds them offline
PROFILE_ANNOTATION = "qwen-serving/profile"
# preStop waits for vLLM's running and waiting requests to reach 0 before SIGTERM; the grace
# period bounds that wait. 10 min lets a long generation finish (a max-length answer at a
# few tens of tokens/s); the gateway drains its own side in 300 s.
GRACE_PERIOD_S = 600
# Image placeholders; k8s/components/images maps them to pinned images in one place.
ENGINE_IMAGES = {"gpu": "vllm-openai", "cpu": "vllm-cpu"}
MODEL_BUILDER_IMAGE = "qwen-serving-model-builder"
GPU_RESOURCE = "nvidia.com/gpu"
GPU_NODE_LABEL = "nvidia.com/gpu.present"  # set by NVIDIA GPU feature discovery
# Built-in models the model-builder image can make, by name: the command, the output last.
BUILD_COMMANDS = {TINY_MODEL: ["serving", "model", "tiny", "--out"]}
# The engine image ships huggingface_hub; downloads are resumable and skip what is present.
FETCH_SCRIPT = (
    "import sys; from huggingface_hub import snapshot_download; "
    "list(map(snapshot_download, sys.argv[1:]))"
)
# The optional Secret `hf-token` (key `token`), for gated or private models, as a file that
# huggingface_hub reads through HF_TOKEN_PATH: not an env variable, which leaks into process
# listings and crash reports. Without the Secret the directory is empty and public models
# download anonymously.
HF_TOKEN_VOLUME = "hf-token"
HF_TOKEN_KEY = "token"
HF_TOKEN_DIR = "/etc/hf-token"
# Init containers write only to the PVC, /cache and /tmp: the root filesystem is read-only.
INIT_MOUNTS = [
    {"name": "models", "mountPath": MODELS_DIR},
    {"name": "cache", "mountPath": "/cache"},
    {"name": "tmp", "mountPath": "/tmp"},
]
INIT_ENV = [
    {"name": "HOME", "value": "/cache/home"},
    {"name": "XDG_CACHE_HOME", "value": "/cache"},
]
# Same restrictions as the base containers (the pod sets non-root and seccomp).
RESTRICTED = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}
# A download is network-bound and a tiny-model build trains a few-million-parameter model:
# both small next to the engine.
FETCH_RESOURCES = {
    "requests": {"cpu": "500m", "memory": "1Gi"},
    "limits": {"cpu": "2", "memory": "2Gi"},
}
BUILD_RESOURCES = {
    "requests": {"cpu": "1", "memory": "2Gi"},
    "limits": {"cpu": "2", "memory": "4Gi"},
}


def _bytes(value: int) -> str:
    return f"{value // GiB}Gi" if value % GiB == 0 else f"{-(-value // MiB)}Mi"


def _cpus(milli: int) -> str:
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def _hub_repo(profile: Profile, field: str, value: str) -> str:
    if not is_hub_name(value):
        raise ServingError(
            f"profile {profile.name}: field '{field}': {value!r} is not a hub name; on "
            "Kubernetes the engine loads hub models (fetched onto the model-cache PVC) or "
            "builtin ones"
        )
    return value


def model_path(profile: Profile) -> str:
    """What vLLM loads in the pod: the hub name (resolved offline from HF_HOME on the PVC),
    or the directory the build-model init container writes for a builtin model."""
    builtin = profile.builtin_model
    if builtin is not None:
        if builtin not in BUILD_COMMANDS:
            known = ", ".join(sorted(BUILD_COMMANDS))
            raise ServingError(
                f"profile {profile.name}: field 'model': builtin {builtin!r} has no "
                f"Kubernetes build (known: {known})"
            )
        return f"{MODELS_DIR}/{builtin}"
    return _hub_repo(profile, "model", profile.model)


def _hub_repos(profile: Profile) -> list[str]:
    """Hub repositories the pod needs on the PVC: the model and a separate tokenizer."""
    repos = [] if profile.builtin_model is not None else [model_path(profile)]
    if profile.tokenizer is not None:
        tokenizer = _hub_repo(profile, "tokenizer", profile.tokenizer)
        if tokenizer not in repos:
            repos.append(tokenizer)
    return repos


def _init_containers(profile: Profile) -> list[Manifest]:
    containers: list[Manifest] = []
    path = model_path(profile)  # refuses a model no pod can get
    builtin = profile.builtin_model
    if builtin is not None:
        containers.append(
            {
                "name": "build-model",
                "image": MODEL_BUILDER_IMAGE,
                "command": [*BUILD_COMMANDS[builtin], path],
                # Its logs and state go to the emptyDir; only the model lands on the PVC.
                "env": [*INIT_ENV, {"name": "SERVING_HOME", "value": "/cache/serving"}],
                "resources": BUILD_RESOURCES,
                "securityContext": RESTRICTED,
                "volumeMounts": INIT_MOUNTS,
            }
        )
    repos = _hub_repos(profile)
    if repos:
        containers.append(
            {
                "name": "fetch-weights",
                "image": ENGINE_IMAGES[profile.device],
                "command": ["python3", "-c", FETCH_SCRIPT, *repos],
                "env": [
                    *INIT_ENV,
                    {"name": "HF_HOME", "value": HF_HOME},
                    {"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"},
                    {"name": "HF_TOKEN_PATH", "value": f"{HF_TOKEN_DIR}/{HF_TOKEN_KEY}"},
                ],
                "resources": FETCH_RESOURCES,
                "securityContext": RESTRICTED,
                "volumeMounts": [
                    *INIT_MOUNTS,
                    {"name": HF_TOKEN_VOLUME, "mountPath": HF_TOKEN_DIR, "readOnly": True},
                ],
            }
        )
    return containers


def _engine_container(profile: Profile, sizing: EngineSizing) -> Manifest:
    # Offline always: the init container fetched the weights; the engine must not download.
    env = engine_env(profile, offline=True)
    amounts = {"cpu": _cpus(sizing.cpu_request_milli), "memory": _bytes(sizing.memory_bytes)}
    limits = {"cpu": _cpus(sizing.cpu_limit_milli), "memory": _bytes(sizing.memory_bytes)}
    if sizing.gpus:
        amounts[GPU_RESOURCE] = limits[GPU_RESOURCE] = str(sizing.gpus)
    return {
        "name": "vllm",
        "image": ENGINE_IMAGES[profile.device],
        # A chat template as its text: the pod has no copy of this package's template files.
        "args": engine_args(
            profile,
            model_path(profile),
            host=ENGINE_HOST,
            port=POD_ENGINE_PORT,
            inline_templates=True,
        ),
        "env": [{"name": name, "value": env[name]} for name in sorted(env)],
        # Memory request == limit: memory is not compressible, and a pod using more than it
        # requested is the first evicted under node pressure, mid-stream.
        "resources": {"requests": amounts, "limits": limits},
        # The period is repeated here because the threshold is computed from it.
        "startupProbe": {
            "periodSeconds": STARTUP_PERIOD_S,
            "failureThreshold": sizing.startup_failure_threshold,
        },
    }


def _check_no_adapters(profile: Profile) -> None:
    """LoRA adapters need their files in the pod, which no init container provides yet."""
    if profile.lora is not None and profile.lora.adapters:
        raise ServingError(
            f"profile {profile.name}: field 'lora.adapters': LoRA adapters are not deployable "
            "on Kubernetes yet (no init container fetches or builds them); serve them with "
            "`serving up`"
        )


def engine_patch(profile: Profile) -> list[Manifest]:
    """The patch documents: Deployment `engine`, then PVC `model-cache`."""
    _check_no_adapters(profile)
    init_containers = _init_containers(profile)  # first: a model no pod can get is the error
    sizing = engine_sizing(profile)
    pod: Manifest = {"terminationGracePeriodSeconds": GRACE_PERIOD_S}
    if profile.device == "gpu":
        pod["nodeSelector"] = {GPU_NODE_LABEL: "true"}
        pod["tolerations"] = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    pod["initContainers"] = init_containers
    pod["containers"] = [_engine_container(profile, sizing)]
    shm = {"medium": "Memory", "sizeLimit": _bytes(sizing.shm_bytes)}
    pod["volumes"] = [{"name": "shm", "emptyDir": shm}]
    if any(container["name"] == "fetch-weights" for container in init_containers):
        secret = {"secretName": HF_TOKEN_VOLUME, "optional": True}
        pod["volumes"].append({"name": HF_TOKEN_VOLUME, "secret": secret})
    deployment: Manifest = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "engine"},
        "spec": {
            "template": {
                "metadata": {"annotations": {PROFILE_ANNOTATION: profile.name}},
                "spec": pod,
            }
        },
    }
    pvc: Manifest = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "model-cache"},
        "spec": {"resources": {"requests": {"storage": _bytes(sizing.storage_bytes)}}},
    }
    return [deployment, pvc]


def header(profile: Profile, sizing: EngineSizing) -> list[str]:
    """The comment the generated file starts with: where it comes from and why its numbers."""
    lines = [
        f"generated by `serving k8s render --profile {profile.name}`; do not edit.",
        f"Change profile {profile.name}, then run `serving k8s render --all`: a test fails",
        "while this file and its profile disagree.",
    ]
    if profile.description:
        lines.append(f"{profile.name}: {profile.description}")
    lines.append("sizing (serving/k8s/sizing.py):")
    lines += [f"  {reason}" for reason in sizing.reasons()]
    return [f"# {line}" for line in lines]


class _PlainDumper(yaml.SafeDumper):
    """No anchors: the init containers share mounts and settings, and `&id001` aliases would
    make the file harder to read and diff."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def render_patch(profile: Profile) -> str:
    """The file `k8s/overlays/<overlay>/engine.generated.yaml` holds, byte for byte.

    A profile across several nodes runs as a LeaderWorkerSet (`serving.k8s.leaderworkerset`,
    built from this patch): its patch deletes the base's Deployment and sizes the volume."""
    documents = engine_patch(profile)
    if profile.nodes > 1:
        delete = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "engine"}}
        # The volume first: kustomize 5.x crashes on a file whose first patch is a delete.
        documents = [documents[1], {**delete, "$patch": "delete"}]
    # sort_keys off: the order above reads like a Deployment; a wide line keeps the long
    # argument strings unfolded whatever PyYAML's default width.
    body = yaml.dump_all(documents, Dumper=_PlainDumper, sort_keys=False, width=4096)
    return "\n".join(header(profile, engine_sizing(profile))) + "\n" + body
