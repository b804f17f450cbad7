"""vLLM's own router (`vllm-router` on PyPI) as its users run it, started by the `Launcher`.

    router = await start_router(launcher, "router-ca", [url_a, url_b], policy="cache_aware",
                                cpu=1, model="bench-model")
    router.base_url, router.version

What it is (0.1.17): a Python launcher around a Rust extension (`vllm_router_rs`, axum and
tokio), one process; the console script `vllm-router` sits beside this interpreter. Its
defaults are kept (policy `cache_aware`, retries, circuit breaker, health checks every 60 s,
log level info) except three that a benchmark must set:
- `--port`: its default 30000 is shared by every instance;
- `--prometheus-port`: its metrics listener defaults to 29000 for every instance, so a second
  router would fail to bind it; each one gets a free port;
- `--worker-startup-check-interval 1`: it waits for every worker's /health before it serves,
  re-checking every 30 s by default, which would add up to 30 s to a start for nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from bench.gateway_overhead.load import Target
from bench.gateway_overhead.processes import BenchError, Launcher, free_port

PACKAGE = "vllm-router"
REQUIREMENT = "vllm-router==0.1.17"
POLICIES = (
    "round_robin",
    "cache_aware",
    "power_of_two",
    "random",
    "consistent_hash",
    "sticky_least_loaded",
)
READY_TIMEOUT_S = 60.0
DECISIONS = "vllm_router_prefix_routing_decisions_total"
"""How cache_aware decided, by `outcome`: prefix_hit, prefix_miss, load_imbalance, and
missing_tokens (a request without token ids, e.g. any chat completion: no prefix matching)."""


class RouterUnavailable(BenchError):
    """vllm-router is not installed here (its paths are then skipped, with this reason)."""


@dataclass(frozen=True)
class RouterProcess:
    name: str
    base_url: str
    metrics_url: str
    policy: str
    version: str


def executable() -> Path:
    """The `vllm-router` console script of this interpreter's environment."""
    path = Path(sys.executable).parent / "vllm-router"
    if not path.exists():
        raise RouterUnavailable(
            f"{PACKAGE} is not installed in this environment (`pip install '{REQUIREMENT}'`, "
            "in the dev extra)"
        )
    return path


def version() -> str:
    try:
        return metadata.version(PACKAGE)
    except metadata.PackageNotFoundError as exc:
        raise RouterUnavailable(f"{PACKAGE} is not installed") from exc


def command(workers: Sequence[str], *, policy: str, port: int, metrics_port: int) -> list[str]:
    if policy not in POLICIES:
        raise BenchError(f"vllm-router policy {policy!r}: choose from {', '.join(POLICIES)}")
    return [
        str(executable()),
        *("--host", "127.0.0.1", "--port", str(port)),
        *("--worker-urls", *workers),
        *("--policy", policy),
        *("--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port)),
        *("--worker-startup-check-interval", "1"),
    ]


async def start_router(
    launcher: Launcher,
    name: str,
    workers: Sequence[str],
    *,
    policy: str,
    cpu: int,
    model: str,
    timeout_s: float = READY_TIMEOUT_S,
) -> RouterProcess:
    """Start a router in front of `workers` and wait until it answers a chat completion."""
    found = version()
    port, metrics_port = free_port(), free_port()
    argv = command(workers, policy=policy, port=port, metrics_port=metrics_port)
    launcher.start(name, argv, cpu=cpu, cwd=launcher.workdir)
    base_url = f"http://127.0.0.1:{port}"
    # No client auth in the router: whatever key is sent goes on to the workers unchecked.
    target = Target(base_url=base_url, api_key="sk-unchecked", model=model)
    await launcher.wait_ready(name, target, timeout_s=timeout_s)
    return RouterProcess(
        name=name,
        base_url=base_url,
        metrics_url=f"http://127.0.0.1:{metrics_port}/metrics",
        policy=policy,
        version=found,
    )


async def decisions(metrics_url: str) -> dict[str, float]:
    """The router's prefix routing decisions so far, by outcome (empty for policies that
    make none)."""
    timeout = aiohttp.ClientTimeout(total=10)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.get(metrics_url) as response,
    ):
        text = await response.text()
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == DECISIONS:
                outcome = sample.labels.get("outcome", "?")
                counts[outcome] = counts.get(outcome, 0.0) + sample.value
    return counts
