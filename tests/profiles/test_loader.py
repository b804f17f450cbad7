from pathlib import Path

import pytest

from serving.errors import ServingError
from serving.profiles import builtin_profile_names, load_all_profiles, load_profile
from serving.profiles.loader import parse_profile

FIXTURES = Path(__file__).parent.parent / "fixtures"
BASE = {
    "device": "cpu",
    "model": "builtin:qwen3-tiny",
    "served_model_name": "m",
    "max_model_len": 64,
}


def test_shipped_profiles_cover_the_deployments_users_ask_for() -> None:
    names = set(builtin_profile_names())
    assert {"cpu-tiny", "cpu-tiny-tp2"} <= names
    profiles = {profile.name: profile for profile in load_all_profiles()}
    gpu = [p for p in profiles.values() if p.device == "gpu"]
    assert any(p.quantization == "awq" and p.tensor_parallel_size == 1 for p in gpu)
    assert any(p.quantization == "none" and p.tensor_parallel_size == 4 for p in gpu)
    assert any(p.max_model_len >= 131072 and p.tensor_parallel_size == 4 for p in gpu)
    assert any(p.quantization == "awq" and p.tensor_parallel_size == 4 for p in gpu)
    assert profiles["cpu-tiny-tp2"].tensor_parallel_size == 2
    assert profiles["cpu-tiny-vl"].limit_mm_per_prompt.get("image") == 4


def test_broken_fixture_names_the_field() -> None:
    with pytest.raises(ServingError) as excinfo:
        load_profile(str(FIXTURES / "broken-profile.yaml"))
    message = str(excinfo.value)
    assert "max_model_len" in message and "\n" not in message
    assert "-5" in message


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ({"dtype": "float8"}, "dtype"),
        ({"quantization": "gptq"}, "quantization"),
        ({"tensor_parallel_size": 0}, "tensor_parallel_size"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
        ({"max_num_seqs": "many"}, "max_num_seqs"),
        ({"tensor_paralel_size": 2}, "tensor_paralel_size"),
        ({"device": "gpu"}, "gpu is required"),
        ({"device": "gpu", "gpu": "rtx-4090", "tensor_parallel_size": 4}, "gpu_count"),
        ({"enable_chunked_prefill": False, "max_num_batched_tokens": 32}, "max_num_batched_tokens"),
        ({"kv_cache_memory_bytes": 0}, "kv_cache_memory_bytes"),
        (
            {"kv_cache_memory_bytes": 1 << 20, "env": {"VLLM_CPU_KVCACHE_SPACE": "1"}},
            "not both",
        ),
        ({"device": "gpu", "gpu": "rtx-4090", "kv_cache_memory_bytes": 1 << 20}, "cpu profiles"),
        ({"limit_mm_per_prompt": {"images": 4}}, "limit_mm_per_prompt"),
        ({"limit_mm_per_prompt": {"image": -1}}, "limit_mm_per_prompt"),
        ({"limit_mm_per_prompt": {"image": "many"}}, "limit_mm_per_prompt"),
    ],
)
def test_bad_values_name_the_field(override: dict[str, object], field: str) -> None:
    with pytest.raises(ServingError) as excinfo:
        parse_profile({**BASE, **override}, source="x.yaml", default_name="x")
    assert field in str(excinfo.value)
    assert "\n" not in str(excinfo.value)


def test_unknown_profile_lists_the_known_ones() -> None:
    with pytest.raises(ServingError, match="cpu-tiny"):
        load_profile("no-such-profile")


def test_not_a_mapping_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "list.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(ServingError, match="mapping"):
        load_profile(str(path))


def test_cpu_kv_space_comes_from_the_env() -> None:
    assert load_profile("cpu-tiny").cpu_kv_space_gib == 1.0
    assert parse_profile(BASE, source="x", default_name="x").cpu_kv_space_gib == 4.0


def test_cpu_kv_space_in_bytes_for_caches_under_a_gib() -> None:
    small = parse_profile({**BASE, "kv_cache_memory_bytes": 9 << 20}, source="x", default_name="x")
    assert small.cpu_kv_space_gib == 9 / 1024
