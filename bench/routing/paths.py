"""The routing paths, each started as its users would run it in front of the same engines.

    started = await start(SPECS["gw-affinity"], launcher, [url_a, url_b], cpu=1, model=m)
    started.path.target              # what the load generator sends to
    started.processes                # {"gateway": launcher name, ...}: whose CPU is measured

- direct:      the first engine itself, no proxy (the latency baseline; on the real engines,
               everything on one engine: the best prefix cache hit rate there is, with no
               balancing at all);
- gateway:     `serving gateway` with one upstream, no routing: the gateway before routing;
- router-rr, router-ca, router-ch: vllm-router over both, `--policy round_robin`,
               `cache_aware` (its default), `consistent_hash` (by the `x-session-id` header
               the prefix cache workload sends); no client auth (it has none);
- gw-affinity, gw-least, gw-rr: `serving gateway --upstream A,B --routing affinity |
               least-loaded | round-robin`, with a key (limits far above the load);
- gw-router:   our gateway (one upstream: the router, with a key) in front of vllm-router
               (cache_aware) over both: what users would run if routing were the router's,
               since keys and quotas stay the gateway's job.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from bench.gateway_overhead.load import Target
from bench.gateway_overhead.paths import PathUnderTest
from bench.gateway_overhead.processes import BenchError, Launcher
from bench.routing.gateway import start_gateway
from bench.routing.router import start_router

GATEWAY = "gateway"
ROUTER = "router"


@dataclass(frozen=True, kw_only=True)
class Spec:
    name: str
    label: str
    routing: str | None = None
    """The gateway's `--routing` policy; None: no gateway, or one with a single upstream."""
    gateway: bool = False
    router: str | None = None
    """vllm-router's `--policy`; None: no router."""


SPECS: Mapping[str, Spec] = {
    spec.name: spec
    for spec in (
        Spec(name="direct", label="direct to one upstream (no proxy)"),
        Spec(name="gateway", label="our gateway, one engine (nothing to route)", gateway=True),
        Spec(name="router-rr", label="vllm-router, round_robin", router="round_robin"),
        Spec(name="router-ca", label="vllm-router, cache_aware (default)", router="cache_aware"),
        Spec(
            name="router-ch",
            label="vllm-router, consistent_hash (x-session-id)",
            router="consistent_hash",
        ),
        Spec(
            name="gw-affinity",
            label="our gateway, --routing affinity",
            gateway=True,
            routing="affinity",
        ),
        Spec(
            name="gw-least",
            label="our gateway, --routing least-loaded",
            gateway=True,
            routing="least-loaded",
        ),
        Spec(
            name="gw-rr",
            label="our gateway, --routing round-robin",
            gateway=True,
            routing="round-robin",
        ),
        Spec(
            name="gw-router",
            label="our gateway -> vllm-router (cache_aware)",
            gateway=True,
            router="cache_aware",
        ),
    )
}


@dataclass(frozen=True)
class Started:
    path: PathUnderTest
    processes: Mapping[str, str] = field(default_factory=dict)
    """Role (`gateway`, `router`) -> the launcher name of that process."""
    router_metrics: str | None = None
    """The router's /metrics, on paths with one."""


async def start(
    spec: Spec, launcher: Launcher, upstreams: Sequence[str], *, cpu: int, model: str
) -> Started:
    """Start what `spec` needs in front of `upstreams`; return once it answers a chat."""
    if len(upstreams) < 2:
        raise BenchError(f"{spec.name}: routing needs two upstreams, got {list(upstreams)}")
    processes: dict[str, str] = {}
    router_metrics = None
    notes = []
    target = Target(base_url=upstreams[0], api_key="sk-direct", model=model)
    behind = list(upstreams)
    if spec.router is not None:
        name = f"{spec.name}-{ROUTER}" if spec.gateway else spec.name
        router = await start_router(
            launcher, name, upstreams, policy=spec.router, cpu=cpu, model=model
        )
        processes[ROUTER] = name
        router_metrics = router.metrics_url
        behind = [router.base_url]
        target = Target(base_url=router.base_url, api_key="sk-unchecked", model=model)
        notes.append(
            f"vllm-router {router.version}, --policy {spec.router}, its defaults otherwise "
            "(retries, circuit breaker, health checks every 60 s); no client auth"
        )
    if spec.gateway:
        name = f"{spec.name}-{GATEWAY}" if spec.router is not None else spec.name
        gateway = await start_gateway(
            launcher,
            name,
            behind if spec.routing is not None else behind[:1],
            routing=spec.routing,
            cpu=cpu,
            model=model,
        )
        processes[GATEWAY] = name
        target = Target(base_url=gateway.base_url, api_key=gateway.api_key, model=model)
        notes.append(
            "key from `serving keys create` (--keys-db), every limit kind set, far above the "
            "load" + (f"; --routing {spec.routing}" if spec.routing else "")
        )
    main = processes.get(GATEWAY, processes.get(ROUTER))
    path = PathUnderTest(
        name=spec.name, label=spec.label, target=target, process=main, notes="; ".join(notes)
    )
    return Started(path=path, processes=processes, router_metrics=router_metrics)
