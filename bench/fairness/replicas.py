"""Fair sharing across gateway replicas on one Redis, for `python -m bench.fairness`.

    replicas = await start_replicas(launcher, start_gateway, fair_flags, cpu=GATEWAY_CPU)
    for name, (quiet, noisy) in replicas.routes().items():   # each setting's gateways
        ...                                                  # measured like any other
    await replicas.shared()                                  # 1.0 per replica while shared

A redis-server of the benchmark's own (`bench.gateway_overhead.redis_server`: a free port,
nothing saved to disk) and two fair gateways on the one engine, each with the single fair
gateway's flags plus `--redis-url` and `--redis-replicas 2`, so that they share the engine's
slots through Redis (docs/fair-sharing.md, across gateway replicas). Two settings are measured
under each flood: every noisy stream through replica A and the quiet requests through B
("flood on one"), and the noisy streams split evenly over A and B with the quiet requests
alternating A, B, A, ... ("flood on both").
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from bench.fairness.load import metrics
from bench.gateway_overhead.processes import Launcher
from bench.gateway_overhead.redis_server import RedisServer, RedisUnavailable, start_redis

NAMES = ("replica-a", "replica-b")  # launcher names (and logs)
REPLICAS = len(NAMES)
FLOOD_ON_ONE = f"fair, {REPLICAS} replicas, flood on one"
FLOOD_ON_BOTH = f"fair, {REPLICAS} replicas, flood on both"
REPLICA_SETTINGS = (FLOOD_ON_ONE, FLOOD_ON_BOTH)
SHARED_UP = "gateway_queue_shared_up"
SHARING_TIMEOUT_S = 30.0

# Starts a gateway on the engine (launcher name, extra flags) and answers its URL once ready.
StartGateway = Callable[[str, Sequence[str]], Awaitable[str]]


@dataclass(frozen=True)
class Replicas:
    urls: tuple[str, ...]
    flags: tuple[str, ...]
    redis: RedisServer

    def routes(self) -> dict[str, tuple[list[str], list[str]]]:
        """Each setting's gateways: (those of the quiet requests, those of the noisy streams)."""
        a, b = self.urls
        return {FLOOD_ON_ONE: ([b], [a]), FLOOD_ON_BOTH: ([a, b], [a, b])}

    async def shared(self) -> list[float]:
        """Each replica's `gateway_queue_shared_up` now (-1: the gauge is missing)."""
        return [(await metrics(url)).get(SHARED_UP, -1.0) for url in self.urls]


async def _sharing(url: str) -> str | None:
    shared = (await metrics(url)).get(SHARED_UP)
    return None if shared == 1 else f"{SHARED_UP} is {shared}"


async def start_replicas(
    launcher: Launcher, start_gateway: StartGateway, fair_flags: Sequence[str], *, cpu: int
) -> Replicas:
    """Redis on `cpu` and the replicas with `fair_flags`, once both share the slots."""
    try:
        # Beside the gateways, off the engine's core: its work (each replica's report every
        # --slot-sync-interval-s) is the gateways' cost, not the engine's.
        redis = await start_redis(launcher, cpu=cpu)
    except RedisUnavailable as exc:
        raise RedisUnavailable(f"{exc} (or --replicas 0 leaves the replicas out)") from exc
    flags = (*fair_flags, "--redis-url", redis.url, "--redis-replicas", str(REPLICAS))
    urls = tuple([await start_gateway(name, flags) for name in NAMES])
    for name, url in zip(NAMES, urls, strict=True):
        # Ready is not sharing: a replica that has not reached Redis runs its own part of the
        # slots (the slots over --redis-replicas), which would measure something else.
        await launcher.wait_until(
            name, functools.partial(_sharing, url), timeout_s=SHARING_TIMEOUT_S
        )
    return Replicas(urls=urls, flags=flags, redis=redis)


def report_lines(runs: list[dict[str, dict[str, object]]]) -> list[str]:
    """The report's paragraph on the replica rows (none without them): what they measure,
    and any measurement after which a replica was not sharing the slots."""
    names = [name for name, row in runs[0].items() if row.get("setting") in REPLICA_SETTINGS]
    if not names:
        return []
    unshared = [
        f"{name} (run {number}: {shared})"
        for number, run in enumerate(runs, 1)
        for name in names
        if not isinstance(shared := run[name].get("shared_up"), list)
        or any(value != 1 for value in shared)
    ]
    return [
        f"The {REPLICAS} replicas: fair gateways as above (the first --reserved) sharing the",
        "engine's slots through one Redis (--redis-url, --redis-replicas). Flood on one: every",
        "noisy stream through replica A, the quiet requests through B; flood on both: the noisy",
        "streams split evenly over A and B, the quiet requests alternating A, B, A, ...",
        *(
            [f"**Not sharing** ({SHARED_UP} not 1 on both after the flood): {', '.join(unshared)}."]
            if unshared
            else []
        ),
        "",
    ]
