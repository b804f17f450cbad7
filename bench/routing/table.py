"""The routing results as Markdown (what `routing.md` holds, and what is printed).

    print(markdown(doc))

Two tables docs/benchmarks.md quotes: the overhead of each path in front of fast upstreams, and
vLLM's prefix cache hit rate per path on two real engines; then the comparisons the choice
between vllm-router and routing in the gateway rests on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bench.markdown import num as _num
from bench.markdown import pct as _pct
from bench.markdown import spread_table
from bench.markdown import table as _table

Doc = Mapping[str, Any]


def _cpu(summary: Mapping[str, Any], unit: str) -> str:
    total = _num(summary.get(f"proxy_cpu_us_per_{unit}"), ",.0f")
    parts = [
        f"{role} {_num(summary.get(f'{role}_cpu_us_per_{unit}'), ',.0f')}"
        for role in ("gateway", "router")
        if f"{role}_cpu_us_per_{unit}" in summary
    ]
    return f"{total} ({' + '.join(parts)})" if len(parts) > 1 else total


def overhead_table(part: Doc) -> list[str]:
    head = [
        "path",
        "p50 ms",
        "p99 ms",
        "added p50",
        "added p99",
        "req/s (32 conc.)",
        "streams/s (32 conc.)",
        "proxy CPU µs per req",
        "proxy CPU µs per stream",
        "req/s per proxy core",
    ]
    rows = []
    for name, path in part["paths"].items():
        s, r = path["summary"], part["ratios"].get(name, {})
        proxied = name != "direct"
        rows.append(
            [
                path["label"],
                _num(s["p50_ms"], ".2f"),
                _num(s["p99_ms"], ".2f"),
                _num(r.get("added_p50_ms"), "+.2f", " ms"),
                _num(r.get("added_p99_ms"), "+.2f", " ms"),
                _num(s["req_per_s"], ",.0f"),
                _num(s["streams_per_s"], ",.0f"),
                _cpu(s, "req") if proxied else "-",
                _cpu(s, "stream") if proxied else "-",
                _num(s.get("proxy_req_per_s_per_core"), ",.0f") if proxied else "-",
            ]
        )
    return _table(head, rows)


def comparison_lines(part: Doc) -> list[str]:
    """The side-by-side comparisons, in words."""
    lines = []
    paths, ratios = part["paths"], part["ratios"]
    for name in ("gw-affinity", "gw-least"):
        r = ratios.get(name, {})
        if "req_per_s_vs_gw_router" not in r:
            continue
        lines.append(
            f"- {paths[name]['label']} vs our gateway -> vllm-router: "
            f"{_num(r['p50_ms_vs_gw_router'], '+.2f', ' ms')} p50 one at a time, "
            f"{_num(r['req_per_s_vs_gw_router'], '.2f', 'x')} the req/s and "
            f"{_num(r['streams_per_s_vs_gw_router'], '.2f', 'x')} the streams/s at 32 "
            f"concurrent, {_pct(r['proxy_cpu_per_req_vs_gw_router'])} of the proxy CPU per "
            "request."
        )
    for name, path in paths.items():
        r = ratios.get(name, {})
        if "added_p50_ms_vs_gateway" in r:
            lines.append(
                f"- {path['label']} vs our gateway with one engine: "
                f"{_num(r['added_p50_ms_vs_gateway'], '+.2f', ' ms')} p50, "
                f"{_num(r['proxy_cpu_us_per_req_vs_gateway'], '+,.0f', ' µs')} of proxy CPU per "
                "request."
            )
    return lines


def cache_table(part: Doc) -> list[str]:
    head = [
        "path",
        "prefix cache hit rate",
        "of one engine's",
        "busiest engine's share of requests",
        "requests per engine",
        "hit rate per engine",
        "workload s",
        "errors",
    ]
    rows = []
    for result in part["paths"].values():
        engines = result["per_engine"].values()
        rows.append(
            [
                result["label"],
                _pct(result["hit_rate"], ".1f"),
                _pct(result.get("share_of_one_engine_hit_rate")),
                _pct(result["busiest_engine_share"]),
                " / ".join(_num(e["requests"], ".0f") for e in engines),
                " / ".join(_pct(e["hit_rate"]) for e in engines),
                _num(result["wall_s"], ".1f"),
                str(result["errors"]),
            ]
        )
    return _table(head, rows)


def cache_notes(part: Doc) -> list[str]:
    w, config = part["workload"], part["cache_config"]
    notes = [
        f"Workload: {w['conversations']} conversations x {w['turns']} turns ({w['requests']} "
        f"requests), one shared system prompt of ~700 tokens, each turn the whole history "
        f"so far (~150 tokens more per turn), rounds interleaved across conversations in a "
        f"shuffled order, {w['concurrency']} in flight, max_tokens {w['max_tokens']}; model "
        f"`{part['model']}` on {part['engines']} engines (`serving engine --profile "
        f"{part['profile']}`).",
        f"vLLM's cache (vllm:cache_config_info): block size {config.get('block_size')} tokens, "
        f"prefix caching {config.get('enable_prefix_caching')}, "
        f"{config.get('kv_cache_size_tokens')} tokens per engine (nothing is evicted).",
        "Hit rate: vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total (tokens), "
        "read from each engine before and after the path's workload, summed over engines. "
        "Before each path both engines' caches were emptied (POST /reset_prefix_cache, "
        "VLLM_SERVER_DEV_MODE=1), and each path's system prompt starts with a line of its own, "
        "so no path hits what another cached.",
    ]
    for result in part["paths"].values():
        decided = result.get("router_prefix_decisions")
        if decided is not None:
            shown = ", ".join(f"{k} {v:.0f}" for k, v in decided.items()) or "none"
            notes.append(
                f"{result['label']}: the router's own prefix routing decisions in the workload "
                f"(vllm_router_prefix_routing_decisions_total by outcome): {shown}."
            )
    mismatched = [
        name
        for name, r in part["paths"].items()
        if r["client_prompt_tokens"] != r["engine_prompt_tokens"]
    ]
    notes.append(
        "Prompt tokens the clients were charged (usage) equal what the engines counted "
        "(vllm:prompt_tokens_total) on every path."
        if not mismatched
        else f"Prompt tokens differ between client usage and vLLM's counter on: {mismatched} "
        "(requests the proxy sent itself, e.g. retries)."
    )
    return notes


def markdown(doc: Doc) -> str:
    machine = doc["machine"]
    lines = [
        "# Routing across vLLM replicas",
        "",
        f"`{doc['command']}` at {doc['created']}. Machine: {machine['cpus']} cores "
        f"({machine['cpu_model']}), Python {machine['python']}; load average before/after "
        f"{machine['loadavg_before']} / {machine['loadavg_after']}. vllm-router "
        f"{doc['router_version']}.",
    ]
    overhead = doc.get("overhead")
    if overhead:
        plan = overhead["plan"]
        lines += [
            "",
            "## Overhead in front of two fast upstreams",
            "",
            f"{plan['runs']} interleaved runs of {plan['seconds_per_measurement']:g} s per "
            f"measurement, medians; latency one request at a time (JSON), req/s and streams/s "
            f"at {plan['concurrency']} concurrent; 20-token responses from two fast local "
            f"upstreams; {overhead['pinning']}. Proxy CPU is each proxy process's own (user + "
            "system, /proc), per request answered; req/s per proxy core = 1 / that.",
            "",
            *overhead_table(overhead),
            "",
            *comparison_lines(overhead),
            "",
            *spread_table(overhead),
            "",
            *(f"- {p['label']}: {p['notes']}" for p in overhead["paths"].values() if p["notes"]),
            *(f"- {name}: not measured: {why}" for name, why in overhead["skipped"].items()),
            *(f"- {note}" for note in overhead["notes"]),
        ]
    cache = doc.get("prefix_cache")
    if cache:
        lines += [
            "",
            "## vLLM's prefix cache hit rate, shared-prefix workload over two engines",
            "",
            *cache_table(cache),
            "",
            *(f"- {note}" for note in cache_notes(cache)),
            *(f"- {name}: not measured: {why}" for name, why in cache["skipped"].items()),
        ]
    lines += ["", *(f"- {note}" for note in doc.get("notes", []))]
    return "\n".join(lines).rstrip() + "\n"
