"""A profile's `lora` section: vLLM's limits and the adapters, each refusal one line naming its
field (serving/profiles/lora.py)."""

from __future__ import annotations

from typing import Any

import pytest

from serving.errors import ServingError
from serving.profiles import load_profile
from serving.profiles.loader import parse_profile
from serving.profiles.lora import Lora, LoraAdapter
from serving.vllm_flags import DEFAULT_MAX_LORA_RANK, DEFAULT_MAX_LORAS

BASE = {
    "device": "cpu",
    "model": "builtin:qwen3-tiny",
    "served_model_name": "qwen3-tiny",
    "max_model_len": 64,
}
TEAM_A = {"name": "team-a", "path": "builtin:qwen3-tiny-lora", "rank": 8}


def parse(lora: Any) -> Any:
    return parse_profile({**BASE, "lora": lora}, source="x.yaml", default_name="x")


def test_the_shipped_profile_serves_the_built_adapter_beside_its_base() -> None:
    profile = load_profile("cpu-tiny-lora")
    assert profile.lora is not None
    assert (profile.lora.max_loras, profile.lora.max_lora_rank) == (2, 8)
    (adapter,) = profile.lora.adapters
    assert (adapter.name, adapter.builtin, adapter.rank) == ("team-a", "qwen3-tiny-lora", 8)
    # Everything else is cpu-tiny's: the same base model, served the same way (its variables
    # too, and those of LoRA's runtime routes), but for the tenants' priority classes.
    plain = load_profile("cpu-tiny")
    assert profile.scheduling_policy == "priority"
    own = {"name", "description", "lora", "env", "scheduling_policy"}
    assert profile.model_dump(exclude=own) == plain.model_dump(exclude=own)
    assert plain.env.items() <= profile.env.items()


def test_an_empty_section_turns_lora_on_with_vllms_defaults() -> None:
    lora = parse({}).lora
    assert lora == Lora()
    assert (lora.max_loras, lora.max_lora_rank) == (DEFAULT_MAX_LORAS, DEFAULT_MAX_LORA_RANK)
    assert lora.adapters == () and lora.max_cpu_loras is None
    assert parse_profile(BASE, source="x.yaml", default_name="x").lora is None


def test_adapter_paths_of_every_kind() -> None:
    lora = parse(
        {
            "max_lora_rank": 16,
            "adapters": [
                TEAM_A,
                {"name": "team-b", "path": "/srv/adapters/b", "rank": 16},
                {"name": "org/team-c", "path": "someone/qwen3-lora", "rank": 1},
            ],
        }
    ).lora
    assert [a.builtin for a in lora.adapters] == ["qwen3-tiny-lora", None, None]
    assert lora.adapters[1] == LoraAdapter(name="team-b", path="/srv/adapters/b", rank=16)


@pytest.mark.parametrize(
    ("lora", "field", "words"),
    [
        ({"max_lora_rank": 7}, "lora", "max_lora_rank: 7 is not one of vLLM's (1, 8, 16"),
        ({"max_loras": 0}, "lora.max_loras", "greater than or equal to 1"),
        ({"max_loras": 2, "max_cpu_loras": 1}, "lora", "max_cpu_loras: 1 is less than max_loras 2"),
        ({"max_lora_rank": 8, "adapters": [{**TEAM_A, "rank": 16}]}, "lora",
         "team-a has rank 16, more than max_lora_rank 8"),
        ({"adapters": [TEAM_A, {**TEAM_A, "path": "/other"}]}, "lora",
         "adapters: the name 'team-a' is used twice"),
        ({"adapters": [{**TEAM_A, "rank": 0}]}, "lora.adapters.0.rank", "greater than or equal"),
        ({"adapters": [{**TEAM_A, "name": "team=a"}]}, "lora.adapters.0.name", "match pattern"),
        ({"adapters": [{**TEAM_A, "name": "team a"}]}, "lora.adapters.0.name", "match pattern"),
        ({"adapters": [{**TEAM_A, "name": "a,b"}]}, "lora.adapters.0.name", "match pattern"),
        ({"adapters": [{**TEAM_A, "path": ""}]}, "lora.adapters.0.path", "at least 1"),
        ({"adapters": [{"name": "team-a", "path": "/a"}]}, "lora.adapters.0.rank", "required"),
        ({"adapters": [{**TEAM_A, "alpha": 16}]}, "lora.adapters.0.alpha", "not permitted"),
        ({"max_lora": 2}, "lora.max_lora", "not permitted"),
        ({"adapters": [{**TEAM_A, "name": "qwen3-tiny"}]}, "profile",
         "lora.adapters: 'qwen3-tiny' is the served_model_name"),
    ],
)  # fmt: skip
def test_each_refusal_is_one_line_naming_its_field(lora: Any, field: str, words: str) -> None:
    with pytest.raises(ServingError) as excinfo:
        parse(lora)
    message = str(excinfo.value)
    assert f"field '{field}'" in message, message
    assert words in message, message
    assert "\n" not in message
