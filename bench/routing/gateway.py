"""Our gateway routing over several engines, as its users start it.

    if routing_supported():
        gw = await start_gateway(launcher, "gw-affinity", [a, b], routing="affinity", cpu=1,
                                 model="bench-model")
        Target(base_url=gw.base_url, api_key=gw.api_key, model=...)

`serving gateway --upstream A,B --routing POLICY` with a real key from `serving keys create`
(every limit kind set far above the load, as in the gateway overhead benchmark, so the quota
engine runs on every request but never refuses). `routing=None` starts it with one upstream
and no `--routing`: the gateway as it was before routing. Whether this checkout's gateway
routes at all is read from its `--help`, so the benchmark runs (and says what it skipped)
before and after the flag lands.
"""

from __future__ import annotations

import asyncio
import functools
import os
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from bench.gateway_overhead.load import Target
from bench.gateway_overhead.paths import BENCH_KEY_LIMITS, READY_TIMEOUT_S, REPO_ROOT, serving_argv
from bench.gateway_overhead.processes import BenchError, Launcher, free_port

ROUTING_FLAG = "--routing"
ISSUE_POLICIES = ("affinity", "least-loaded", "round-robin")


class RoutingUnavailable(BenchError):
    """This gateway has no --routing (its routing paths are then skipped, with this reason)."""


@dataclass(frozen=True)
class GatewayProcess:
    name: str
    base_url: str
    api_key: str
    routing: str | None


def _run(argv: list[str], env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=REPO_ROOT,
        timeout=60,
        check=False,
    )
    if done.returncode != 0:
        raise BenchError(f"`{' '.join(argv[2:])}` failed ({done.returncode}): {done.stderr}")
    return done.stdout + done.stderr


@functools.cache
def routing_policies() -> tuple[str, ...]:
    """The policies `serving gateway --routing` accepts; empty when it has no such flag."""
    text = _run(serving_argv("gateway", "--help"))
    if ROUTING_FLAG not in text:
        return ()
    # Choices show as `--routing {a,b,c}`; a flag made from a plain str field shows none, and
    # then the issue's three are assumed (one the gateway lacks fails at start, in its words).
    braced = re.search(re.escape(ROUTING_FLAG) + r"\s+\{([^}]+)\}", text)
    if braced:
        return tuple(choice.strip() for choice in braced.group(1).split(","))
    return ISSUE_POLICIES


def require_routing(policy: str) -> None:
    policies = routing_policies()
    if not policies:
        raise RoutingUnavailable(f"this gateway has no {ROUTING_FLAG} (serving gateway --help)")
    if policy not in policies:
        raise RoutingUnavailable(
            f"{ROUTING_FLAG} {policy}: not offered (choices: {', '.join(policies)})"
        )


def _create_key(store: str, env: dict[str, str]) -> str:
    created = _run(
        serving_argv("keys", "create", "--store", store, "--name", "bench", *BENCH_KEY_LIMITS), env
    )
    for line in created.splitlines():
        if line.startswith("secret:"):
            return line.split(":", 1)[1].strip()
    raise BenchError(f"`serving keys create` printed no secret:\n{created}")


async def start_gateway(
    launcher: Launcher,
    name: str,
    upstreams: Sequence[str],
    *,
    routing: str | None,
    cpu: int,
    model: str,
    timeout_s: float = READY_TIMEOUT_S,
) -> GatewayProcess:
    """Start `serving gateway` in front of `upstreams` and wait until it answers a chat."""
    if routing is not None:
        require_routing(routing)
    elif len(upstreams) != 1:
        raise BenchError(f"{name}: several upstreams need a routing policy")
    home = launcher.workdir / f"{name}-home"
    home.mkdir(exist_ok=True)
    env = {"SERVING_HOME": str(home)}
    store = str(home / "bench-keys.db")
    key = await asyncio.to_thread(_create_key, store, env)
    port = free_port()
    argv = serving_argv("gateway", "--upstream", ",".join(upstreams), "--port", str(port))
    argv += ["--keys-db", store]
    if routing is not None:
        argv += [ROUTING_FLAG, routing]
    launcher.start(name, argv, cpu=cpu, env=env, cwd=REPO_ROOT)
    base_url = f"http://127.0.0.1:{port}"
    target = Target(base_url=base_url, api_key=key, model=model)
    await launcher.wait_ready(name, target, timeout_s=timeout_s)
    return GatewayProcess(name=name, base_url=base_url, api_key=key, routing=routing)
