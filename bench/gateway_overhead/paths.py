"""The paths of the local benchmark, each set up as its users would run it.

    upstream = await start_upstream(launcher)                       # core 0
    path = await start_path("gateway", launcher, upstream.base_url) # core 1

- direct:      the load generator talks to the fast upstream itself;
- passthrough: `bench.gateway_overhead.passthrough` (plain ASGI, uvicorn, aiohttp client);
- gateway:     `serving gateway --upstream URL --port N` with a real key: from a key store
               (`serving keys create` + `--keys-db`, limits far above the load) when the
               gateway has that flag, else from SERVING_API_KEY; quotas in-process;
- gateway-redis: the same gateway with `--redis-url`: quotas in a redis-server started here
               (`redis_server`), whose CPU and command counters are measured with the path;
- litellm:     LiteLLM's proxy, one worker, defaults (see `litellm_proxy`).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from bench.gateway_overhead import litellm_proxy
from bench.gateway_overhead.load import Target
from bench.gateway_overhead.processes import BenchError, Launcher, free_port
from bench.gateway_overhead.redis_server import RedisServer, start_redis
from bench.gateway_overhead.upstream import MODEL
from serving.gateway.settings import API_KEY_ENV

PROXY_CPU = 1
LOAD_CPU = 0
# Redis shares the load generator's core, not the proxy's: in a deployment Redis runs on a
# machine of its own, so the proxy core measures the gateway alone (its Redis client
# included), as on every other path; Redis's own CPU is measured and shown apart. Unpinned,
# the scheduler would also put it on the proxy's core and charge its work to the gateway.
REDIS_CPU = LOAD_CPU
REDIS_PROCESS = "redis"
GATEWAY_REDIS = "gateway-redis"
READY_TIMEOUT_S = 60.0
LITELLM_READY_TIMEOUT_S = 240.0
REPO_ROOT = Path(__file__).resolve().parents[2]
LABELS = {
    "direct": "direct to upstream",
    "passthrough": "minimal passthrough (ASGI + uvicorn + aiohttp client)",
    "gateway": "our gateway (serving gateway)",
    GATEWAY_REDIS: "our gateway, Redis quota store (--redis-url)",
    "litellm": "LiteLLM proxy (1 worker, defaults)",
}
ALL_PATHS = tuple(LABELS)
# Far above what the benchmark sends, so the quota engine runs but never refuses.
BENCH_KEY_LIMITS = (
    # every limit kind, so admission, settling and the budget journal all run per request
    *("--rpm", "100000000", "--tpm", "100000000000", "--max-concurrency", "100000"),
    *("--tokens-per-day", "100000000000000", "--tokens-per-month", "100000000000000"),
)


@dataclass(frozen=True, kw_only=True)
class PathUnderTest:
    name: str
    label: str
    target: Target
    process: str | None = None
    """Launcher name of the proxy process whose CPU is measured; None when not ours."""
    notes: str = ""
    redis: RedisServer | None = None
    """The Redis the proxy keeps its quotas in (launcher name `REDIS_PROCESS`): its CPU and
    the commands it processed are measured with the path."""


async def start_upstream(launcher: Launcher) -> PathUnderTest:
    port = free_port()
    argv = [sys.executable, "-m", "bench.gateway_overhead.upstream", "--port", str(port)]
    launcher.start("upstream", argv, cpu=LOAD_CPU, cwd=REPO_ROOT)
    target = Target(base_url=f"http://127.0.0.1:{port}", api_key="sk-direct", model=MODEL)
    await launcher.wait_ready("upstream", target, timeout_s=READY_TIMEOUT_S)
    return PathUnderTest(
        name="direct", label=LABELS["direct"], target=target, notes="fast local upstream"
    )


async def start_path(name: str, launcher: Launcher, upstream: str) -> PathUnderTest:
    """Start the proxy `name` in front of `upstream` and wait until it answers."""
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    timeout = READY_TIMEOUT_S
    redis = None
    if name == "passthrough":
        key = "sk-passthrough"
        argv = [
            *(sys.executable, "-m", "bench.gateway_overhead.passthrough"),
            *("--upstream", upstream, "--port", str(port)),
        ]
        launcher.start(name, argv, cpu=PROXY_CPU, cwd=REPO_ROOT)
        notes = "no auth, no quota, no metrics"
    elif name == "gateway":
        key, notes = _start_gateway(launcher, name, upstream, port)
    elif name == GATEWAY_REDIS:
        redis = await start_redis(launcher, cpu=REDIS_CPU, name=REDIS_PROCESS)
        key, notes = _start_gateway(launcher, name, upstream, port, redis_url=redis.url)
        notes += (
            f"; quota counters in Redis {redis.version} (a redis-server started here on core "
            f'{REDIS_CPU}, with the upstream and the load generator, `--save "" --appendonly '
            "no`); day/month budgets in Redis too, so no keys.db budget journal"
        )
    elif name == "litellm":
        key = "sk-bench-" + secrets.token_hex(16)
        executable = await asyncio.to_thread(
            litellm_proxy.ensure_installed,
            litellm_proxy.VENV_DIR,
            log=litellm_proxy.INSTALL_LOG,
        )
        argv, env = litellm_proxy.proxy_command(
            executable, launcher.workdir, upstream=upstream, port=port, master_key=key, model=MODEL
        )
        launcher.start(name, argv, cpu=PROXY_CPU, env=env, cwd=launcher.workdir)
        notes = f"{litellm_proxy.LITELLM_REQUIREMENT}, master key auth, no database"
        timeout = LITELLM_READY_TIMEOUT_S
    else:
        raise BenchError(f"--paths: unknown path {name!r} (choose from {', '.join(ALL_PATHS)})")
    target = Target(base_url=base_url, api_key=key, model=MODEL)
    await launcher.wait_ready(name, target, timeout_s=timeout)
    return PathUnderTest(
        name=name, label=LABELS[name], target=target, process=name, notes=notes, redis=redis
    )


def serving_argv(*args: str) -> list[str]:
    """`serving <args>` in this interpreter."""
    return [sys.executable, "-m", "serving.cli", *args]


def create_key(store: Path, name: str) -> str:
    """A key with the benchmarks' limits in the key store `store`: its secret."""
    done = subprocess.run(
        serving_argv("keys", "create", "--store", str(store), "--name", name, *BENCH_KEY_LIMITS),
        capture_output=True, text=True, cwd=REPO_ROOT, check=False,
    )  # fmt: skip
    secret = next((line.split(":", 1)[1].strip() for line in done.stdout.splitlines()
                   if line.startswith("secret:")), "")  # fmt: skip
    if done.returncode or not secret:
        raise BenchError(f"serving keys create failed: {done.stderr or done.stdout}")
    return secret


def _start_gateway(
    launcher: Launcher, name: str, upstream: str, port: int, *, redis_url: str | None = None
) -> tuple[str, str]:
    """Start `serving gateway` as `name`; the API key it accepts, and how the key was
    provisioned."""
    home = launcher.workdir / f"{name}-home"
    home.mkdir(exist_ok=True)
    env = {"SERVING_HOME": str(home)}
    argv = serving_argv("gateway", "--upstream", upstream, "--port", str(port))
    if redis_url is not None:
        argv += ["--redis-url", redis_url]
    help_text = _run(serving_argv("gateway", "--help"), env)
    if "--keys-db" in help_text:
        store = home / "bench-keys.db"
        created = _run(
            serving_argv(
                "keys", "create", "--store", str(store), "--name", "bench", *BENCH_KEY_LIMITS
            ),
            env,
        )
        key = next(
            (
                line.split(":", 1)[1].strip()
                for line in created.splitlines()
                if line.startswith("secret:")
            ),
            "",
        )
        if not key:
            raise BenchError(f"gateway: `serving keys create` printed no secret:\n{created}")
        argv += ["--keys-db", str(store)]
        notes = (
            "key from `serving keys create` (--keys-db), every limit kind set, far above the load"
        )
    else:
        key = "sk-bench-" + secrets.token_hex(16)
        env[API_KEY_ENV] = key
        notes = f"key from {API_KEY_ENV} (this gateway has no --keys-db yet)"
    launcher.start(name, argv, cpu=PROXY_CPU, env=env, cwd=REPO_ROOT)
    return key, notes


def _run(argv: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        cwd=REPO_ROOT,
        timeout=60,
        check=False,
    )
    if done.returncode != 0:
        raise BenchError(f"`{' '.join(argv[2:])}` failed ({done.returncode}): {done.stderr}")
    return done.stdout + done.stderr
