"""Real vLLM engines for the prefix cache part: started, reset, and read.

    engines = await start_engines(launcher, count=2, profile="cpu-tiny")  # in parallel
    await reset_prefix_cache(engine)          # before each path
    before = await read_counters(engine)      # vLLM's own counters, from its /metrics

Each engine is `serving engine --profile P --port N`, the way users start one, with its own
launcher metrics port and log file (two engines would otherwise share both), `--no-restart`
(a benchmark must see an engine die, not a fresh one with an empty cache), and vLLM's
development endpoints on (`VLLM_SERVER_DEV_MODE=1`) for `POST /reset_prefix_cache`. With a
core per engine, engine i's threads are bound to core i (`VLLM_CPU_OMP_THREADS_BIND`).
"""

from __future__ import annotations

import asyncio
import functools
import os
import sys
import time
from dataclasses import dataclass

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from bench.gateway_overhead.paths import REPO_ROOT
from bench.gateway_overhead.processes import BenchError, Launcher, free_port
from loadtest.scraper import (
    PREFIX_HITS,
    PREFIX_QUERIES,
    PROMPT_TOKENS,
    REQUEST_SUCCESS,
    parse_metrics,
)

ENGINE_READY_TIMEOUT_S = 900.0
RESET_TIMEOUT_S = 60.0
HTTP_TIMEOUT_S = 10.0
CACHE_CONFIG = "vllm:cache_config_info"
COUNTERS = {
    "hits": PREFIX_HITS,
    "queries": PREFIX_QUERIES,
    "requests": REQUEST_SUCCESS,
    "prompt_tokens": PROMPT_TOKENS,
}


@dataclass(frozen=True)
class Engine:
    name: str
    base_url: str


async def _get(url: str) -> tuple[int, str]:
    timeout = aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session, session.get(url) as response:
        return response.status, await response.text()


async def _healthy(engine: Engine) -> str | None:
    try:
        status, body = await _get(engine.base_url + "/health")
    except (aiohttp.ClientError, TimeoutError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None if status == 200 else f"/health answered {status}: {body[:100]}"


async def start_engines(launcher: Launcher, *, count: int, profile: str) -> list[Engine]:
    """Start `count` engines at once and wait until every one is healthy."""
    engines = []
    cpus = os.cpu_count() or 1
    for index in range(count):
        name = f"engine-{index}"
        port = free_port()
        argv = [
            *(sys.executable, "-m", "serving.cli", "engine", "--profile", profile),
            *("--port", str(port), "--metrics-port", str(free_port())),
            *("--log-file", str(launcher.workdir / f"{name}-vllm.log"), "--no-restart"),
        ]
        env = {"VLLM_SERVER_DEV_MODE": "1"}
        if cpus >= count:
            # Left to itself every vLLM binds its threads to core 0 (keeping the last core
            # for its front end), so two engines would take turns on one core; replicas have
            # hardware of their own.
            env["VLLM_CPU_OMP_THREADS_BIND"] = str(index)
        launcher.start(name, argv, cpu=0, env=env, cwd=REPO_ROOT)
        engines.append(Engine(name=name, base_url=f"http://127.0.0.1:{port}"))
    await asyncio.gather(
        *(
            launcher.wait_until(
                engine.name, functools.partial(_healthy, engine), timeout_s=ENGINE_READY_TIMEOUT_S
            )
            for engine in engines
        )
    )
    return engines


async def read_counters(engine: Engine) -> dict[str, float]:
    """The engine's prefix cache hits and queries (tokens), finished requests and prompt
    tokens so far, summed over label sets."""
    status, text = await _get(engine.base_url + "/metrics")
    if status != 200:
        raise BenchError(f"{engine.name}: /metrics answered {status}")
    values = parse_metrics(text)
    missing = [series for series in COUNTERS.values() if series not in values]
    if missing:
        raise BenchError(f"{engine.name}: /metrics has no {missing}")
    return {key: values[series] for key, series in COUNTERS.items()}


async def cache_config(engine: Engine) -> dict[str, str]:
    """vLLM's own account of its cache: block size, prefix caching on or off, capacity."""
    _, text = await _get(engine.base_url + "/metrics")
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == CACHE_CONFIG:
                wanted = ("block_size", "enable_prefix_caching", "kv_cache_size_tokens")
                return {key: sample.labels.get(key, "?") for key in wanted}
    raise BenchError(f"{engine.name}: /metrics has no {CACHE_CONFIG}")


async def reset_prefix_cache(engine: Engine) -> None:
    """Empty the engine's prefix cache. vLLM refuses (`success: false`) while requests still
    hold blocks, so retry until it is idle."""
    url = engine.base_url + "/reset_prefix_cache"
    deadline = time.monotonic() + RESET_TIMEOUT_S
    timeout = aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S)
    answer = ""
    while time.monotonic() < deadline:
        async with aiohttp.ClientSession(timeout=timeout) as session, session.post(url) as resp:
            answer = await resp.text()
            if resp.status == 404:
                raise BenchError(f"{engine.name}: no {url} (VLLM_SERVER_DEV_MODE=1 not honoured)")
            if resp.status == 200 and '"success":true' in answer.replace(" ", ""):
                return
        await asyncio.sleep(0.5)
    raise BenchError(
        f"{engine.name}: prefix cache not reset within {RESET_TIMEOUT_S:.0f} s: {answer}"
    )
