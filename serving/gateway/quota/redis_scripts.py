"""The Redis store's server-side scripts: one per operation, each run as one atomic step.

    source = script_source("reserve")    # common.lua + reserve.lua
    reply = await client.run_script(lua_script("reserve"), keys, args)

The Lua lives in `lua/` next to this module (package data): `common.lua` holds what every
operation shares (the clock, the calendar, the sliding minute, a scope's counters, ending
a lease) and the prelude every script runs first (ending the leases its caller queued), and
is prepended to each operation's own file, since EVALSHA scripts cannot include one another.
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Literal

from serving.gateway.quota.redis_client import LuaScript

ScriptName = Literal["reserve", "settle", "renew", "reclaim", "snapshot"]
SCRIPT_NAMES: tuple[ScriptName, ...] = ("reserve", "settle", "renew", "reclaim", "snapshot")


@functools.cache
def script_source(name: ScriptName) -> str:
    folder = resources.files(__package__).joinpath("lua")
    common = folder.joinpath("common.lua").read_text(encoding="utf-8")
    return common + "\n" + folder.joinpath(f"{name}.lua").read_text(encoding="utf-8")


@functools.cache
def lua_script(name: ScriptName) -> LuaScript:
    return LuaScript(script_source(name))
