"""The engine patch is the profile, restated for Kubernetes: args vLLM parses back to the
profile's values, GPUs equal to TP, the weights' source, offline env, sizes that follow it."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from serving.errors import ServingError
from serving.k8s.engine_patch import (
    ENGINE_HOST,
    GPU_RESOURCE,
    POD_ENGINE_PORT,
    PROFILE_ANNOTATION,
    engine_patch,
    model_path,
    render_patch,
)
from serving.k8s.overlays import OVERLAYS
from serving.k8s.sizing import engine_sizing
from serving.profiles import Profile, load_profile
from serving.vllm_flags import engine_args, engine_env, engine_flag
from tests.test_vllm_flags import engine_args_from, parse_with_vllm

KIND_ENGINE = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "engine"}}
OVERLAY_PROFILES = [load_profile(name) for name in OVERLAYS.values()]
GPU_PROFILES = [profile for profile in OVERLAY_PROFILES if profile.device == "gpu"]


def pod_spec(profile: Profile) -> dict[str, Any]:
    deployment, _ = engine_patch(profile)
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return spec


def vllm(profile: Profile) -> dict[str, Any]:
    (container,) = pod_spec(profile)["containers"]
    assert container["name"] == "vllm"
    return dict(container)


def init(profile: Profile) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in pod_spec(profile)["initContainers"]}


@pytest.mark.parametrize("profile", OVERLAY_PROFILES, ids=lambda p: p.name)
def test_args_are_the_launchers_and_vllm_parses_them_back(profile: Profile) -> None:
    args = vllm(profile)["args"]
    assert args == engine_args(profile, model_path(profile), host=ENGINE_HOST, port=POD_ENGINE_PORT)
    built = engine_args_from(parse_with_vllm(args))
    assert built.model == model_path(profile)
    assert built.tensor_parallel_size == profile.tensor_parallel_size
    assert built.max_model_len == profile.max_model_len
    assert built.max_num_seqs == profile.max_num_seqs
    assert built.kv_cache_dtype == profile.kv_cache_dtype
    assert built.enforce_eager == profile.enforce_eager
    assert built.quantization == (None if profile.quantization == "none" else profile.quantization)
    if profile.device == "gpu":
        assert built.gpu_memory_utilization == profile.gpu_memory_utilization


@pytest.mark.parametrize("profile", GPU_PROFILES, ids=lambda p: p.name)
def test_gpu_count_is_tp_and_pods_land_on_gpu_nodes(profile: Profile) -> None:
    resources = vllm(profile)["resources"]
    tp = str(profile.tensor_parallel_size)
    assert resources["limits"][GPU_RESOURCE] == resources["requests"][GPU_RESOURCE] == tp
    spec = pod_spec(profile)
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]
    assert vllm(profile)["image"] == "vllm-openai"


def test_cpu_profile_asks_for_no_gpu_and_runs_anywhere() -> None:
    profile = load_profile("cpu-tiny")
    resources = vllm(profile)["resources"]
    assert GPU_RESOURCE not in resources["limits"] and GPU_RESOURCE not in resources["requests"]
    assert "nodeSelector" not in pod_spec(profile) and "tolerations" not in pod_spec(profile)
    assert vllm(profile)["image"] == "vllm-cpu"


@pytest.mark.parametrize("profile", OVERLAY_PROFILES, ids=lambda p: p.name)
def test_env_is_the_launchers_offline_with_the_profiles_own(profile: Profile) -> None:
    env = {item["name"]: item["value"] for item in vllm(profile)["env"]}
    assert env == engine_env(profile, offline=True)
    assert env["HF_HUB_OFFLINE"] == "1" and env["VLLM_NO_USAGE_STATS"] == "1"
    assert env.items() >= profile.env.items()


def test_builtin_model_is_built_onto_the_pvc_and_served_from_it() -> None:
    profile = load_profile("cpu-tiny")
    assert model_path(profile) == "/models/qwen3-tiny"
    assert list(init(profile)) == ["build-model"]
    build = init(profile)["build-model"]
    assert build["image"] == "qwen-serving-model-builder"
    assert build["command"][:3] == ["serving", "model", "tiny"]
    assert build["command"][-1] == "/models/qwen3-tiny"


def test_hub_model_is_fetched_into_hf_home_and_loaded_by_name() -> None:
    profile = load_profile("qwen2.5-7b-awq-4090")
    assert model_path(profile) == profile.model  # resolved offline from HF_HOME
    assert list(init(profile)) == ["fetch-weights"]
    fetch = init(profile)["fetch-weights"]
    assert fetch["image"] == "vllm-openai"
    assert fetch["command"][:2] == ["python3", "-c"] and "snapshot_download" in fetch["command"][2]
    assert fetch["command"][3:] == [profile.model]
    env = {item["name"]: item["value"] for item in fetch["env"]}
    assert env["HF_HOME"] == "/models/hf"
    # the optional token Secret as a file huggingface_hub reads (HF_TOKEN_PATH)
    mounts = {mount["name"]: mount["mountPath"] for mount in fetch["volumeMounts"]}
    assert env["HF_TOKEN_PATH"] == mounts["hf-token"] + "/token"
    volumes = {volume["name"]: volume for volume in pod_spec(profile)["volumes"]}
    assert volumes["hf-token"]["secret"] == {"secretName": "hf-token", "optional": True}


def test_a_separate_hub_tokenizer_is_fetched_too() -> None:
    profile = load_profile("qwen2.5-7b-awq-4090").model_copy(update={"tokenizer": "Qwen/Tok"})
    assert init(profile)["fetch-weights"]["command"][3:] == [profile.model, "Qwen/Tok"]


@pytest.mark.parametrize(
    ("update", "field"),
    [
        ({"model": "/data/local-model"}, "model"),
        ({"model": "builtin:unknown-model"}, "model"),
        ({"tokenizer": "./tok"}, "tokenizer"),
    ],
)
def test_models_a_pod_cannot_get_are_refused(update: dict[str, str], field: str) -> None:
    profile = load_profile("qwen2.5-7b-awq-4090").model_copy(update=update)
    with pytest.raises(ServingError, match=f"field '{field}'"):
        engine_patch(profile)


def test_a_profile_that_does_not_fit_is_refused() -> None:
    profile = load_profile("qwen2.5-7b-awq-4090").model_copy(update={"max_model_len": 1 << 20})
    with pytest.raises(ServingError, match="does not fit"):
        engine_patch(profile)


def test_shm_grows_with_tensor_parallelism_and_counts_in_memory() -> None:
    one, four = load_profile("qwen2.5-7b-awq-4090"), load_profile("qwen2.5-7b-fp16-tp4-4090")
    assert engine_sizing(four).shm_bytes > engine_sizing(one).shm_bytes
    for profile in OVERLAY_PROFILES:
        sizing = engine_sizing(profile)
        volume = pod_spec(profile)["volumes"][0]
        assert volume == {
            "name": "shm",
            "emptyDir": {"medium": "Memory", "sizeLimit": f"{sizing.shm_bytes >> 30}Gi"},
        }
        assert sizing.memory_bytes >= sizing.shm_bytes + sizing.checkpoint_bytes // (
            profile.tensor_parallel_size
        )
        resources = vllm(profile)["resources"]
        assert resources["requests"]["memory"] == resources["limits"]["memory"]


def test_startup_budget_covers_reading_and_compiling_and_eager_needs_less() -> None:
    compiled = load_profile("qwen2.5-7b-fp16-tp4-4090")
    eager = compiled.model_copy(update={"enforce_eager": True})
    probe = vllm(compiled)["startupProbe"]
    budget = probe["periodSeconds"] * probe["failureThreshold"]
    sizing = engine_sizing(compiled)
    assert budget >= sizing.startup_seconds > sizing.read_seconds > 0
    assert engine_sizing(eager).startup_failure_threshold < sizing.startup_failure_threshold
    bigger = engine_sizing(load_profile("qwen3.5-27b-awq-tp4"))
    smaller = engine_sizing(load_profile("qwen2.5-7b-awq-4090"))
    assert bigger.read_seconds > smaller.read_seconds


def test_pvc_holds_two_checkpoints() -> None:
    for profile in OVERLAY_PROFILES:
        _, pvc = engine_patch(profile)
        sizing = engine_sizing(profile)
        assert pvc["metadata"]["name"] == "model-cache"
        assert pvc["spec"]["resources"]["requests"]["storage"] == f"{sizing.storage_bytes >> 30}Gi"
        assert sizing.storage_bytes >= 2 * sizing.checkpoint_bytes


@pytest.mark.parametrize("profile", OVERLAY_PROFILES, ids=lambda p: p.name)
def test_rendered_file_is_deterministic_yaml_with_its_origin_first(profile: Profile) -> None:
    text = render_patch(profile)
    assert text == render_patch(profile)
    assert text.startswith(f"# generated by `serving k8s render --profile {profile.name}`")
    assert "do not edit" in text.splitlines()[0] and "&id" not in text
    if profile.nodes > 1:  # a LeaderWorkerSet replaces the Deployment (test_leaderworkerset)
        pvc, deleted = yaml.safe_load_all(text)
        assert deleted == {**KIND_ENGINE, "$patch": "delete"}
        assert (pvc["kind"], pvc["metadata"]["name"]) == ("PersistentVolumeClaim", "model-cache")
        return
    deployment, pvc = yaml.safe_load_all(text)
    assert (deployment["kind"], deployment["metadata"]["name"]) == ("Deployment", "engine")
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations == {PROFILE_ANNOTATION: profile.name}
    assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= 300
    assert (pvc["kind"], pvc["metadata"]["name"]) == ("PersistentVolumeClaim", "model-cache")
    # quantities and numbers in args stay strings: kubectl rejects ints in args
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert all(isinstance(arg, str) for arg in args)
    assert args[args.index(engine_flag("port")) + 1] == str(POD_ENGINE_PORT)


def test_a_profile_with_lora_adapters_is_refused_naming_the_field() -> None:
    # No init container fetches or builds adapters yet: a pod would start without their files.
    with pytest.raises(ServingError, match=r"field 'lora\.adapters': LoRA adapters are not dep"):
        engine_patch(load_profile("cpu-tiny-lora"))


def test_a_profile_for_runtime_adapters_renders_with_lora_on() -> None:
    # LoRA on with no adapters listed: the gateway loads them at run time (docs/adapters.md).
    profile = load_profile("cpu-tiny-lora")
    assert profile.lora is not None
    runtime = profile.model_copy(update={"lora": profile.lora.model_copy(update={"adapters": ()})})
    container = vllm(runtime)
    assert engine_flag("enable_lora") in container["args"]
    assert {"name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "value": "1"} in container["env"]


def test_a_chat_template_goes_into_the_pod_as_its_text() -> None:
    """The pod runs vLLM's image, without this package's template files."""
    profile = load_profile("qwen3-reranker-0.6b-4090")
    args = vllm(profile)["args"]
    template = args[args.index(engine_flag("chat_template")) + 1]
    assert template.startswith("<|im_start|>system\nJudge whether the Document")
    assert args == engine_args(
        profile, model_path(profile), host=ENGINE_HOST, port=POD_ENGINE_PORT, inline_templates=True
    )
