"""The engines `serving up` runs: one or more profiles, each `--replicas` times, and what the
gateway in front of them must know of them.

Rules:
- profile i's replica r is engine `i x replicas + r`, listening on `--engine-port + 2 x that`
  (its launcher's metrics on the next port): the first profile's engines come first, so a
  one-profile stack keeps the ports it always had; at most MAX_ENGINES in all;
- no two profiles may serve the same model name: the gateway routes a request for model M to
  the engines that list M (its catalog reads each engine's /v1/models), so a name two
  profiles shared would reach either engine, whichever settings it has;
- the gateway takes one value per setting for every engine: the fair queue runs
  `engine_slots` x engines requests at once (`engine_slots_for` makes that safe for
  engines of several sizes), the priority classes go to every engine alike (the profiles
  must agree on scheduling_policy), and the chat settings (stream interval, images) are the
  first generating profile's, the only kind of engine that reads them.

Usage:
    engines = stack_engines(profiles, replicas=1, engine_port=8001, launcher_port=8002)
    settings = gateway_stack_settings(profiles, replicas=1, scheduling="fair")
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from serving.errors import ServingError

if TYPE_CHECKING:
    from serving.profiles.model import Profile

# Engines one `serving up` runs, profiles x replicas: their ports (from --engine-port, two
# each) stay below GATEWAY_METRICS_PORT's default.
MAX_ENGINES = 16


@dataclass(frozen=True)
class StackEngine:
    """One engine of the stack: which profile, which of its replicas, where it listens."""

    profile: Profile
    replica: int
    index: int  # over the whole stack: the gateway's upstream order
    port: int
    launcher_port: int | None  # its launcher's metrics; None when they are off

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def check_profiles(profiles: Sequence[Profile]) -> None:
    """Refuse a profile list the gateway could not route unambiguously, before any starts."""
    if not profiles:
        raise ServingError("--profile: name at least one profile")
    seen: dict[str, str] = {}
    for profile in profiles:
        for key in (f"profile {profile.name}", f"model {profile.served_model_name}"):
            if key in seen:
                raise ServingError(
                    f"--profile: {seen[key]} and {profile.name} both name {key}: each profile "
                    "must serve a model of its own (more engines of one: --replicas)"
                )
            seen[key] = profile.name
    policies = {profile.scheduling_policy for profile in profiles}
    if len(policies) > 1:
        named = ", ".join(f"{p.name} {p.scheduling_policy}" for p in profiles)
        raise ServingError(
            f"--profile: the profiles' scheduling_policy differ ({named}); the gateway sends "
            "every engine the same request priorities: make them agree"
        )


def stack_engines(
    profiles: Sequence[Profile], *, replicas: int, engine_port: int, launcher_port: int
) -> list[StackEngine]:
    """Every engine of the stack in order; `launcher_port` 0: launcher metrics off."""
    check_profiles(profiles)
    count = len(profiles) * replicas
    if count > MAX_ENGINES:
        raise ServingError(
            f"--profile x --replicas: {len(profiles)} x {replicas} = {count} engines, "
            f"more than the {MAX_ENGINES} one stack runs"
        )
    engines: list[StackEngine] = []
    for profile in profiles:
        for replica in range(replicas):
            index = len(engines)
            launcher = launcher_port + 2 * index if launcher_port else None
            engines.append(StackEngine(profile, replica, index, engine_port + 2 * index, launcher))
    return engines


def chat_profile(profiles: Sequence[Profile]) -> Profile:
    """The profile whose settings the gateway's chat paths take: the first generating one
    (a stack of pooling profiles only: the first)."""
    return next((p for p in profiles if p.runner == "generate"), profiles[0])


def engine_slots_for(profiles: Sequence[Profile], replicas: int) -> int:
    """The gateway's one `engine_slots` for engines of several profiles.

    The fair queue lets `engine_slots x engines` requests run at once, wherever they go, and
    a request for a model goes only to that model's engines: so that even when every running
    request is for one model its engines run no more than their max_num_seqs (past it, the
    rest would wait in vLLM's first-come queue, not the fair one), the least over the
    profiles of `max_num_seqs x its engines / all engines`. One profile: its max_num_seqs,
    as before; a chat and a pooling profile of 16 each: 8, so 16 run at once in all."""
    engines = len(profiles) * replicas
    return max(1, min(p.max_num_seqs * replicas // engines for p in profiles))


def gateway_engine_settings(profile: Profile, scheduling: str) -> dict[str, int | str]:
    """What the gateway must know of the engine it fronts: its sequences (the fair queue's
    slots), the queue policy, whether vLLM orders by priority (then the keys' classes are
    sent as each request's `priority`), and the tokens per stream event to ask for."""
    return {
        "engine_slots": profile.max_num_seqs,
        "scheduling": scheduling,
        "engine_priority": str(profile.scheduling_policy == "priority").lower(),
        "stream_interval": profile.stream_interval,
    }


def gateway_stack_settings(
    profiles: Sequence[Profile], *, replicas: int, scheduling: str
) -> dict[str, int | str]:
    """`gateway_engine_settings` for the whole stack: the chat profile's, with the slots
    every profile's engines can take (`engine_slots_for`)."""
    check_profiles(profiles)
    settings = gateway_engine_settings(chat_profile(profiles), scheduling)
    settings["engine_slots"] = engine_slots_for(profiles, replicas)
    return settings
