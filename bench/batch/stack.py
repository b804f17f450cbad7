"""The stack the batch benchmark measures: one cpu-tiny engine, one gateway with a keys db.

    async with bench_stack(Path(tmp)) as stack:
        stack.gateway_url, stack.keys["interactive"], stack.keys["batch"], stack.engine

The gateway is told what `serving up` tells it of its engine (fair queue, slots, priority), so
batch lines wait behind interactive requests exactly as in a deployment; its Batch API keeps
its database and files beside the keys db (the default when a keys db is set).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from bench.gateway_overhead.paths import READY_TIMEOUT_S, REPO_ROOT, create_key, serving_argv
from bench.gateway_overhead.processes import Launcher, can_pin, free_port
from bench.routing.engines import Engine, start_engines
from serving.gateway.setting_names import flag_name
from serving.stack_engines import gateway_engine_settings

PROFILE = "cpu-tiny"
SCHEDULING = "fair"
GATEWAY_CPU = 1
KEY_NAMES = ("interactive", "batch")


@dataclass(frozen=True)
class Stack:
    engine: Engine
    gateway_url: str
    keys: dict[str, str]
    engine_slots: int


@contextlib.asynccontextmanager
async def bench_stack(tmp: Path) -> AsyncIterator[Stack]:
    from serving.profiles import load_profile

    profile = load_profile(PROFILE)
    told = gateway_engine_settings(profile, SCHEDULING)
    flags = [part for name, value in told.items() for part in (flag_name(name), str(value))]
    with Launcher(tmp, pin=can_pin()) as launcher:
        (engine,) = await start_engines(launcher, count=1, profile=PROFILE)
        keys_db = tmp / "keys.db"
        keys = {name: create_key(keys_db, name) for name in KEY_NAMES}
        port = free_port()
        argv = serving_argv("gateway", "--upstream", engine.base_url, "--port", str(port),
                        "--keys-db", str(keys_db), "--drain-delay", "0", *flags)  # fmt: skip
        launcher.start("gateway", argv, cpu=GATEWAY_CPU, cwd=REPO_ROOT)
        url = f"http://127.0.0.1:{port}"

        async def ready() -> str | None:
            try:
                async with aiohttp.ClientSession() as s, s.get(url + "/readyz") as r:
                    return None if r.status == 200 else f"/readyz {r.status}"
            except aiohttp.ClientError as exc:
                return str(exc)

        await launcher.wait_until("gateway", ready, timeout_s=READY_TIMEOUT_S)
        yield Stack(engine, url, keys, profile.max_num_seqs)
