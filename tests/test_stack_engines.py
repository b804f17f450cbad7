"""`serving up` with several profiles: each profile's engines on ports after the previous
profile's, profiles the gateway could not route apart refused before any engine starts, and
one set of gateway settings that no engine's max_num_seqs is exceeded under."""

from __future__ import annotations

import pytest

from serving.errors import ServingError
from serving.gateway.settings import GatewaySettings
from serving.profiles import load_profile
from serving.profiles.model import Profile
from serving.stack_engines import (
    MAX_ENGINES,
    chat_profile,
    engine_slots_for,
    gateway_stack_settings,
    stack_engines,
)

CHAT, EMBEDDING, RERANKER = "cpu-tiny", "cpu-tiny-embedding", "cpu-tiny-reranker"


def profiles(*names: str) -> list[Profile]:
    return [load_profile(name) for name in names]


def test_each_profiles_engines_follow_the_previous_ones() -> None:
    engines = stack_engines(
        profiles(CHAT, EMBEDDING), replicas=2, engine_port=9001, launcher_port=9002
    )
    assert [(e.profile.name, e.replica, e.index) for e in engines] == [
        (CHAT, 0, 0), (CHAT, 1, 1), (EMBEDDING, 0, 2), (EMBEDDING, 1, 3),
    ]  # fmt: skip
    assert [e.port for e in engines] == [9001, 9003, 9005, 9007]
    assert [e.launcher_port for e in engines] == [9002, 9004, 9006, 9008]
    assert engines[2].url == "http://127.0.0.1:9005"


def test_one_profile_keeps_the_ports_it_always_had() -> None:
    (engine,) = stack_engines(profiles(CHAT), replicas=1, engine_port=8001, launcher_port=0)
    assert (engine.port, engine.launcher_port) == (8001, None)


@pytest.mark.parametrize(
    ("names", "message"),
    [
        ((CHAT, CHAT), "cpu-tiny and cpu-tiny both name profile cpu-tiny"),
        # two profiles of one served model: the gateway could not tell their engines apart
        ((CHAT, "cpu-tiny-smallkv"), "both name model qwen3-tiny"),
        ((EMBEDDING, "cpu-tiny-lora"), "scheduling_policy differ"),
        ((), "name at least one profile"),
    ],
)
def test_profiles_the_gateway_could_not_route_apart_are_refused(
    names: tuple[str, ...], message: str
) -> None:
    with pytest.raises(ServingError, match=message):
        stack_engines(profiles(*names), replicas=1, engine_port=8001, launcher_port=0)


def test_more_engines_than_one_stack_runs_are_refused() -> None:
    with pytest.raises(ServingError, match=f"2 x 9 = 18 engines, more than the {MAX_ENGINES}"):
        stack_engines(profiles(CHAT, EMBEDDING), replicas=9, engine_port=8001, launcher_port=0)


def test_slots_never_let_one_models_engines_run_past_their_max_num_seqs() -> None:
    chat, embedding, reranker = profiles(CHAT, EMBEDDING, RERANKER)
    assert engine_slots_for([chat], 3) == chat.max_num_seqs  # as a one-profile stack
    for group in ([chat, embedding], [chat, embedding, reranker], [embedding, reranker]):
        for replicas in (1, 2, 3):
            slots = engine_slots_for(group, replicas)
            queue = slots * len(group) * replicas  # what the fair queue runs at once
            for profile in group:
                assert queue <= profile.max_num_seqs * replicas, (profile.name, replicas)
            assert slots >= 1
    assert engine_slots_for([chat, embedding], 1) == 8  # 16 at once: all of one engine's


def test_the_chat_settings_are_the_first_generating_profiles() -> None:
    chat, embedding, reranker = profiles(CHAT, EMBEDDING, RERANKER)
    assert chat_profile([embedding, chat]) is chat
    assert chat_profile([embedding, reranker]) is embedding
    settings = gateway_stack_settings([embedding, chat], replicas=1, scheduling="fair")
    assert settings["stream_interval"] == chat.stream_interval != embedding.stream_interval
    assert settings["engine_slots"] == 8
    upstream = "http://127.0.0.1:1,http://127.0.0.1:2"
    loaded = GatewaySettings.create(upstream=upstream, api_keys=["k"], **settings)
    assert loaded.queue_slots == 16
