"""The results as Markdown: the side-by-side table, the targets, notes, the pieces and the
profile.

    print(local_markdown(results))      # also what `gateway_overhead.md` holds

A Markdown table reads well in a terminal too, so one format serves both.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from bench.gateway_overhead.paths import GATEWAY_REDIS
from bench.gateway_overhead.pieces import pieces_lines
from bench.gateway_overhead.redis_server import ROUND_TRIPS, TOTAL, script_commands
from bench.markdown import num as _num
from bench.markdown import pct as _pct
from bench.markdown import spread_table
from bench.markdown import table as _table
from bench.results_files import machine_lines

Doc = Mapping[str, Any]


def local_table(doc: Doc) -> list[str]:
    head = [
        "path",
        "p50 ms",
        "p99 ms",
        "added p50",
        "added p99",
        "req/s (32 conc.)",
        "req/s vs passthrough",
        "streams/s (32 conc.)",
        "chunks/s",
        "streams/s vs passthrough",
        "proxy CPU µs per req / per stream (core busy)",
    ]
    rows = []
    for name, path in doc["paths"].items():
        s, r = path["summary"], doc["ratios"].get(name, {})
        cost = (
            f"{_num(s['proxy_cpu_us_per_req'], ',.0f')} ({_pct(s['proxy_cpu_json'])}) / "
            f"{_num(s['proxy_cpu_us_per_stream'], ',.0f')} ({_pct(s['proxy_cpu_stream'])})"
            if name != "direct"
            else "-"
        )
        rows.append(
            [
                path["label"],
                _num(s["p50_ms"], ".2f"),
                _num(s["p99_ms"], ".2f"),
                _num(r.get("added_p50_ms"), "+.2f", " ms"),
                _num(r.get("added_p99_ms"), "+.2f", " ms"),
                _num(s["req_per_s"], ",.0f"),
                _pct(r.get("req_share_of_passthrough")),
                _num(s["streams_per_s"], ",.0f"),
                _num(s["chunks_per_s"], ",.0f"),
                _pct(r.get("streams_share_of_passthrough")),
                cost,
            ]
        )
    lines = _table(head, rows)
    gateway = doc["ratios"].get("gateway", {})
    if "req_times_litellm" in gateway:
        lines += [
            "",
            f"Our gateway vs LiteLLM: {_num(gateway['req_times_litellm'], '.1f', 'x')} the "
            f"req/s, {_num(gateway['streams_times_litellm'], '.1f', 'x')} the streams/s.",
        ]
    return lines + redis_lines(doc)


def redis_lines(doc: Doc) -> list[str]:
    """The Redis store against the in-process one, and the commands Redis processed."""
    path = doc["paths"].get(GATEWAY_REDIS)
    if path is None:
        return []
    s, r = path["summary"], doc["ratios"].get(GATEWAY_REDIS, {})
    lines = []
    if "req_share_of_in_process" in r:
        lines += [
            "",
            f"Redis store vs in-process store (same gateway, same rounds): "
            f"{_pct(r['req_share_of_in_process'])} of the req/s, "
            f"{_pct(r['streams_share_of_in_process'])} of the streams/s, "
            f"{_num(r['added_p50_ms_vs_in_process'], '+.2f', ' ms')} p50 and "
            f"{_num(r['added_p99_ms_vs_in_process'], '+.2f', ' ms')} p99 one at a time, "
            f"{_num(r['proxy_cpu_us_per_req_vs_in_process'], '+,.0f', ' µs')} of gateway CPU "
            "per request.",
        ]
    commands = path.get("redis_commands", {})
    inside = script_commands()
    sent, run = (
        ", ".join(
            f"{name} {calls:,}"
            for name, calls in commands.items()
            if name not in ("requests", TOTAL, ROUND_TRIPS) and (name in inside) == scripted
        )
        or "none"
        for scripted in (False, True)
    )
    lines += [
        "",
        "Redis round trips per request (redis-server's own counters, INFO stats and "
        "commandstats, read before and after each measurement, divided by the requests "
        f"answered meanwhile; medians): {_num(s.get('redis_round_trips_per_req'), '.3f')} at "
        f"32 concurrent ({_num(s.get('redis_evalsha_per_req'), '.3f')} of them EVALSHA), "
        f"{_num(s.get('redis_round_trips_per_stream'), '.3f')} per stream, "
        f"{_num(s.get('redis_round_trips_per_req_one_at_a_time'), '.3f')} one at a time. "
        "A request is one round trip: its reservation (one EVALSHA: admission and the "
        "rate-limit state together), whose script first settles the requests that ended "
        "before it (the store queues each settle until its next call); the rest is upkeep "
        "shared by all requests (PING, renewing running requests' leases, reclaiming expired "
        "ones, every few seconds; settles sent by themselves when no reservation came within "
        "the settle delay, as after the last request of a measurement) and connection "
        "set-up. "
        f"In all recorded measurements, for {commands.get('requests', 0):,} requests: "
        f"{commands.get(ROUND_TRIPS, 0):,} round trips ({sent}); inside the scripts Redis ran "
        f"{commands.get(TOTAL, 0) - commands.get(ROUND_TRIPS, 0):,} more commands ({run}), "
        f"{_num(s.get('redis_commands_per_req'), '.1f')} per request in all at 32 concurrent "
        "(total_commands_processed counts both). Redis's own CPU: "
        f"{_num(s.get('redis_cpu_us_per_req'), ',.0f')} µs per request "
        f"({_pct(s.get('redis_cpu_json'))} of a core), "
        f"{_num(s.get('redis_cpu_us_per_stream'), ',.0f')} µs per stream.",
    ]
    return lines


def targets_table(targets: Sequence[Mapping[str, Any]]) -> list[str]:
    rows = []
    for t in targets:
        measured = t["measured"]
        unit = t.get("unit", "")
        if measured is None:
            shown = "-"
        elif unit == "share":
            shown = _pct(measured)
        elif unit == "times":
            shown = _num(measured, ".1f", "x")
        elif unit == "count":
            shown = _num(measured, ".3f")
        else:
            shown = _num(measured, "+.2f", " ms")
        rows.append([t["target"], shown, f"**{t['verdict']}**"])
    return _table(["target", "measured", "verdict"], rows)


def profile_lines(
    profile: Mapping[str, Any] | None, *, title: str = "Where the gateway's time goes"
) -> list[str]:
    if not profile:
        return []
    lines = ["", f"## {title} (profile under load)", ""]
    if "skipped" in profile:
        return [*lines, f"No profile: {profile['skipped']}"]
    lines += [
        f"{profile['samples']} samples of the gateway process at 32 concurrent JSON requests, "
        f"then streams; {profile['tool']}. Shares are of the samples in which it was busy.",
        "",
    ]
    for key, title in (
        ("by_area", "by area (innermost Python frame)"),
        ("self", "top functions, self"),
        ("gateway_files", "gateway modules, self"),
        ("inclusive", "gateway functions, including what they call"),
    ):
        rows = [[f"`{e['name']}`", _pct(e["share"])] for e in profile[key]]
        lines += [f"**{title}**", "", *_table(["where", "share"], rows), ""]
    return lines


def _gateway_us_per_stream(doc: Doc) -> float:
    gateway = doc["paths"].get("gateway")
    return float(gateway["summary"].get("proxy_cpu_us_per_stream", "nan")) if gateway else math.nan


def local_markdown(doc: Doc) -> str:
    machine, plan = doc["machine"], doc["plan"]
    lines = [
        "# Gateway overhead benchmark",
        "",
        f"`{doc['command']}` at {doc['created']}; {plan['runs']} interleaved runs of "
        f"{plan['seconds_per_measurement']:g} s per measurement, medians shown; "
        f"{plan['concurrency']} concurrent for req/s and streams/s; 20-token responses "
        "from a fast local upstream (no think time).",
        "",
        f"Machine: {machine['cpus']} cores ({machine['cpu_model']}), Python "
        f"{machine['python']}; {machine['pinning']}. Load average before/after: "
        f"{machine['loadavg_before']} / {machine['loadavg_after']}.",
        "",
        *local_table(doc),
        "",
        *spread_table(doc),
        "",
        *targets_table(doc["targets"]),
        "",
        "## Notes",
        "",
        *(f"- {path['label']}: {path['notes']}" for path in doc["paths"].values() if path["notes"]),
        *(f"- {name}: not measured: {why}" for name, why in doc["skipped"].items()),
        *(f"- {note}" for note in doc["notes"]),
        *pieces_lines(doc.get("pieces") or {}, _gateway_us_per_stream(doc)),
        *profile_lines(doc.get("profile")),
        *profile_lines(
            doc.get("profile_redis"), title="Where the gateway's time goes with the Redis store"
        ),
    ]
    return "\n".join(lines).rstrip() + "\n"


def real_markdown(doc: Doc) -> str:
    head = ["path", "p50 ms", "p99 ms", "req/s", "streams/s", "chunks/s"]
    rows = [
        [
            doc["paths"][name]["label"],
            _num(s["p50_ms"], ".1f"),
            _num(s["p99_ms"], ".1f"),
            _num(s["req_per_s"], ",.1f"),
            _num(s["streams_per_s"], ",.1f"),
            _num(s["chunks_per_s"], ",.0f"),
        ]
        for name, s in ((n, p["summary"]) for n, p in doc["paths"].items())
    ]
    share = doc["share_of_direct"]
    plan = doc["plan"]
    lines = [
        "# Gateway overhead on the real engine",
        "",
        f"`{doc['command']}` at {doc['created']}; model `{doc['model']}`, max_tokens "
        f"{doc['max_tokens']} (ignore_eos); {plan['runs']} interleaved runs of "
        f"{plan['seconds_per_measurement']:g} s, medians; {plan['concurrency']} concurrent.",
        "",
        *(machine_lines(doc["machine"]) if "machine" in doc else []),
        *_table(head, rows),
        "",
        f"Through the gateway: {_pct(share['req_per_s'])} of direct req/s, "
        f"{_pct(share['streams_per_s'])} of direct streams/s, "
        f"{_pct(share['chunks_per_s'])} of direct chunks/s.",
        "",
        *targets_table(doc["targets"]),
        *(f"- {note}" for note in doc["notes"]),
    ]
    return "\n".join(lines).rstrip() + "\n"
