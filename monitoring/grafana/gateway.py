"""The Gateway dashboard: traffic, latency, quotas, fair sharing and upstream health from
`gateway_*` series.

The series are listed in serving/gateway/metrics.py's docstring. `key` is a key's public id,
never its secret. The per-key panels (and the `key` variable) need the job `gateway` to scrape
the gateways' metrics ports (`serving up --gateway-metrics-port`, the overlays' 9100): their
API ports' /metrics leave out every series with a `key` or `model` label. The gateway exports
no remaining budget: the quota store keeps it, and a per-key gauge would have to read every
key's budget on each scrape. So the dashboard charts what each key spent this UTC day and month
(the periods of the tokens/day and tokens/month limits); compare them with the key's limits
(`serving keys show ID`).

The Accounting row sets what the gateways charged against what vLLM counted (the oracle of
docs/gateway.md's charging rules): the expression of the recording rule
stack:gateway_uncharged_tokens:increase10m that ChargesBelowEngineCount fires on, built here
from CUT_SLACK_TOKENS (tests/monitoring holds the two equal), over every engine and every
gateway whatever `$instance` selects.

The Fair sharing row draws, beside the queue's own series, the tokens served per key and
Jain's fairness index over the keys backlogged in the fair queue: the expression of the
recording rule job:gateway_tokens:jain_index_rate5m that FairShareSkewed fires on
(`fairness.jain_index`), over every key and every gateway. The Batches row is
monitoring/grafana/batches.py.
"""

from __future__ import annotations

from typing import Any

from grafana_foundation_sdk.builders import stat

from monitoring.grafana.batches import batch_row
from monitoring.grafana.common import (
    COUNT,
    EVENTS_PER_S,
    INDEX,
    RATE,
    RATIO,
    REQUESTS_PER_S,
    SECONDS,
    TOKENS,
    TOKENS_PER_S,
    UP,
    Board,
    Query,
    label_variable,
    percentile_queries,
    stat_panel,
    table_panel,
    timeseries_panel,
)
from monitoring.grafana.fairness import FAIR_SKEWED, FAIR_WINDOW, jain_index
from serving.gateway.usage import CUT_SLACK_TOKENS

UID = "serving-gateway"
GATEWAYS = 'instance=~"$instance"'
KEYS = f'{GATEWAYS}, key=~"$key"'

# The accounting oracle over 10 minutes, all engines and all gateway replicas summed: what
# vLLM worked on (generated, and prompt tokens computed rather than read from its prefix
# cache), what the gateways charged, the slack their cut sequences are allowed, and the gap
# (rules/recording.yml's stack:gateway_uncharged_tokens:increase10m, the same expression).
ORACLE_WINDOW = "10m"
ENGINE_COUNTED = (
    f'sum(increase(vllm:generation_tokens_total{{job="vllm"}}[{ORACLE_WINDOW}]))\n+\n'
    "sum(increase(vllm:prompt_tokens_by_source_total"
    f'{{job="vllm", source="local_compute"}}[{ORACLE_WINDOW}]))'
)
CHARGED = f'sum(increase(gateway_engine_accounted_tokens_total{{job="gateway"}}[{ORACLE_WINDOW}]))'
CUT_SLACK = (
    f"{CUT_SLACK_TOKENS} * "
    f'sum(increase(gateway_engine_cut_sequences_total{{job="gateway"}}[{ORACLE_WINDOW}]))'
)
UNCHARGED = f"(\n{ENGINE_COUNTED}\n)\n-\n(\n{CHARGED}\n+\n{CUT_SLACK}\n)"
ACCOUNTING_PANEL = "Tokens charged against vLLM's count (10m windows)"

FAIRNESS_PANEL = f"Fairness among backlogged keys (Jain index, {FAIR_WINDOW} windows)"
SERVED_PANEL = f"Tokens served per second by key ({FAIR_WINDOW} windows)"


def _sum_rate(metric: str, selector: str, by: str) -> str:
    return f"sum by ({by}) (rate({metric}{{{selector}}}[{RATE}]))"


def _spent(title: str, period: str, time_from: str) -> stat.Panel:
    """Tokens charged per key since the start of this UTC `period` (the panel's own range)."""
    panel = stat_panel(
        title,
        TOKENS,
        [
            Query(
                f"sum by (key) (increase(gateway_tokens_total{{{KEYS}}}[$__range]))",
                "{{key}}",
                instant=True,
            )
        ],
        description=(
            f"Tokens charged per key since the start of this {period} (UTC), prompt and "
            "completion together: what counts against the key's budget for the "
            f"{period}. The gateway does not export the remaining budget; compare with the "
            "key's limit (`serving keys show ID`)."
        ),
        width=12,
        height=6,
    )
    return panel.time_from(time_from).hide_time_override(False)


def build() -> dict[str, Any]:
    board = Board(
        "Serving / Gateway",
        uid=UID,
        description="The OpenAI-compatible gateway: traffic, added latency, quotas, upstream.",
    )
    board.variable(
        label_variable(
            "instance",
            "Gateway",
            "label_values(gateway_in_flight_requests, instance)",
            description="Gateway replicas (scrape targets exporting gateway_*)",
        )
    )
    board.variable(
        label_variable(
            "key",
            "API key",
            'label_values(gateway_requests_total{instance=~"$instance"}, key)',
            description="Public key ids ('none' for requests refused before a key was known)",
        )
    )

    board.row("Requests")
    board.add(
        timeseries_panel(
            "Requests per second by status",
            REQUESTS_PER_S,
            [Query(_sum_rate("gateway_requests_total", KEYS, "status"), "{{status}}")],
            description="Responses sent, by HTTP status (499: the client left first).",
        )
    )
    board.add(
        timeseries_panel(
            "Requests per second by key",
            REQUESTS_PER_S,
            [Query(_sum_rate("gateway_requests_total", KEYS, "key"), "{{key}}")],
            description="Responses sent, by public key id.",
        )
    )
    board.add(
        timeseries_panel(
            "5xx ratio",
            RATIO,
            [
                Query(
                    "(\n  sum(rate(gateway_requests_total{"
                    f'{KEYS}, status=~"5.."}}[{RATE}]))\n  or vector(0)\n)\n/\n'
                    f"sum(rate(gateway_requests_total{{{KEYS}}}[{RATE}]))",
                    "5xx",
                )
            ],
            description="Share of responses with a 5xx status (upstream errors, no upstream).",
            max_value=1,
            thresholds=[(0.05, "red")],
            width=8,
        )
    )
    board.add(
        timeseries_panel(
            "In-flight requests",
            COUNT,
            [
                Query(
                    f"sum by (instance) (gateway_in_flight_requests{{{GATEWAYS}}})", "{{instance}}"
                )
            ],
            description="API requests being handled now.",
            width=8,
        )
    )
    board.add(
        timeseries_panel(
            "Quota leases held",
            COUNT,
            [Query(f"sum by (instance) (gateway_quota_leases{{{GATEWAYS}}})", "{{instance}}")],
            description="Concurrency leases held; returns to 0 when the gateway is idle.",
            width=8,
        )
    )

    board.row("Latency")
    board.add(
        timeseries_panel(
            "Added latency (the gateway's own time)",
            SECONDS,
            percentile_queries("gateway_added_latency_seconds", GATEWAYS),
            description="Time before forwarding plus after the upstream was done, per request.",
            width=8,
        )
    )
    board.add(
        timeseries_panel(
            "Request duration",
            SECONDS,
            percentile_queries("gateway_request_duration_seconds", GATEWAYS, by="model"),
            description="Gateway entry to the last byte, by model.",
            width=8,
        )
    )
    board.add(
        timeseries_panel(
            "Time to first byte",
            SECONDS,
            percentile_queries("gateway_time_to_first_byte_seconds", GATEWAYS, by="model"),
            description="Gateway entry to the first body byte, by model.",
            width=8,
        )
    )

    board.row("Quotas and tokens")
    board.add(
        timeseries_panel(
            "Quota rejections per second by reason",
            REQUESTS_PER_S,
            [Query(_sum_rate("gateway_quota_rejections_total", KEYS, "reason"), "{{reason}}")],
            description="Requests refused by a limit: rpm, tpm, concurrency, daily, monthly.",
        )
    )
    board.add(
        table_panel(
            "Quota rejections by key and reason",
            COUNT,
            [
                Query(
                    "sum by (key, reason) "
                    f"(increase(gateway_quota_rejections_total{{{KEYS}}}[$__range]))",
                    instant=True,
                    table=True,
                )
            ],
            transformations=[
                (
                    "organize",
                    {
                        "excludeByName": {"Time": True},
                        "renameByName": {"Value": "rejections in range"},
                    },
                )
            ],
            description="Refusals over the dashboard's time range, per key and limit.",
            height=8,
        )
    )
    board.add(
        timeseries_panel(
            "Tokens per second by key",
            TOKENS_PER_S,
            [Query(_sum_rate("gateway_tokens_total", KEYS, "key, kind"), "{{key}} {{kind}}")],
            description="Tokens charged (vLLM's reported usage), prompt and completion.",
        )
    )
    board.add(
        timeseries_panel(
            "Tokens charged per key, last 24 hours",
            TOKENS,
            [Query(f"sum by (key) (increase(gateway_tokens_total{{{KEYS}}}[1d]))", "{{key}}")],
            description="A rolling 24-hour window of the tokens each key was charged.",
        )
    )
    board.add(_spent("Tokens charged per key today (UTC)", "day", "now/d"))
    board.add(_spent("Tokens charged per key this month (UTC)", "month", "now/M"))

    board.row("Accounting")
    board.add(
        timeseries_panel(
            ACCOUNTING_PANEL,
            TOKENS,
            [
                Query(ENGINE_COUNTED, "counted by vLLM (generated + prompt computed)"),
                Query(CHARGED, "charged by the gateways"),
                Query(CUT_SLACK, f"slack for cut streams ({CUT_SLACK_TOKENS} per sequence)"),
                Query(UNCHARGED, "uncharged: counted - charged - slack"),
            ],
            description=(
                "Over the 10 minutes up to each point, all engines and all gateway replicas "
                "together (whatever Gateway selects): the tokens vLLM worked on, the tokens the "
                "gateways charged to keys for requests on the engines, the slack allowed each "
                "sequence of a stream cut before vLLM's final usage, and the gap. The gap stays "
                "at or below 0 while every token is paid for (below: prompts from vLLM's prefix "
                "cache, charged but not computed); above 0 for 15 minutes fires "
                "ChargesBelowEngineCount (monitoring/RUNBOOK.md). Work still in flight shows as "
                "a short rise: vLLM counts it before the gateway charges it."
            ),
            width=24,
            min_value=None,
            thresholds=[(0, "red")],
        )
    )

    board.row("Fair sharing")
    board.add(
        timeseries_panel(
            "Requests waiting for an engine slot, by key",
            COUNT,
            [Query(f"sum by (key) (gateway_queue_waiting{{{KEYS}}})", "{{key}}")],
            description=(
                "Admitted requests waiting in the gateway because the engines' slots "
                "(--engine-slots x engines) are taken; a flooding key waits, not the others."
            ),
            width=6,
        )
    )
    board.add(
        timeseries_panel(
            "Wait for a slot, by key",
            SECONDS,
            percentile_queries("gateway_queue_wait_seconds", KEYS, by="key"),
            description="Admission to a slot (0 for a request that found one free).",
            width=6,
        )
    )
    board.add(
        timeseries_panel(
            "Engine slots held",
            COUNT,
            [
                Query(f"sum(gateway_queue_running{{{GATEWAYS}}})", "held"),
                Query(f"sum(gateway_queue_slots{{{GATEWAYS}}})", "slots"),
            ],
            description="Requests running on the engines through the fair queue, of all slots.",
            width=6,
        )
    )
    board.add(
        timeseries_panel(
            "Requests that never got a slot",
            REQUESTS_PER_S,
            [
                Query(_sum_rate("gateway_queue_timeouts_total", KEYS, "key"), "timed out {{key}}"),
                Query(
                    _sum_rate("gateway_queue_abandoned_total", KEYS, "key"), "client left {{key}}"
                ),
            ],
            description=(
                "Waited their deadline (503 engine_overloaded, nothing charged), or their "
                "client went away while they waited (nothing charged)."
            ),
            width=6,
        )
    )

    board.add(
        timeseries_panel(
            SERVED_PANEL,
            TOKENS_PER_S,
            [
                Query(
                    f"sum by (key) (rate(gateway_tokens_total{{{KEYS}}}[{FAIR_WINDOW}]))",
                    "{{key}}",
                )
            ],
            description=(
                f"Tokens charged per key over {FAIR_WINDOW}, prompt and completion, every model: "
                "what the fair queue counts as a key's service, over the fairness index's "
                "window. Keys waiting at the same time (the panel 'Requests waiting for an "
                "engine slot, by key') should get alike."
            ),
        )
    )
    board.add(
        timeseries_panel(
            FAIRNESS_PANEL,
            INDEX,
            [Query(jain_index(), "Jain index")],
            description=(
                "Jain's index (sum x)^2 / (n * sum x^2) of the tokens/s served to the n keys "
                f"whose requests waited in the fair queue at every scrape of the last "
                f"{FAIR_WINDOW}: 1 when they are served alike, 1/n when one key got everything. "
                "Keys that waited only now and then were served what they asked and are left "
                "out. No line while fewer than two keys are backlogged. All keys and gateway "
                f"replicas, whatever Gateway and API key select. Below {FAIR_SKEWED} for 10 "
                "minutes fires FairShareSkewed (monitoring/RUNBOOK.md). Key weights are not "
                "exported: keys weighted unequally read below 1 when served by weight."
            ),
            max_value=1,
            thresholds=[(0, "red"), (FAIR_SKEWED, "green")],
        )
    )

    batch_row(board)

    board.row("Upstream")
    board.add(
        stat_panel(
            "Upstream healthy",
            UP,
            [Query(f"min by (instance) (gateway_upstream_healthy{{{GATEWAYS}}})", "{{instance}}")],
            description="1 while at least one engine is in the gateway's rotation.",
            width=8,
            height=8,
            mappings={"0": ("down", "red"), "1": ("up", "green")},
        )
    )
    board.add(
        timeseries_panel(
            "Engines known and in rotation per gateway",
            "short",
            [
                Query(
                    f"max by (instance) (gateway_engines_known{{{GATEWAYS}}})",
                    "{{instance}} known",
                ),
                Query(
                    f"max by (instance) (gateway_engines_healthy{{{GATEWAYS}}})",
                    "{{instance}} in rotation",
                ),
            ],
            description=(
                "Engines each gateway routes to (listed in --upstream or discovered from a "
                "dns+ upstream) and those getting requests: /health passed and no connect "
                "failed since. Fewer in rotation than known: an engine is down or restarting."
            ),
            width=8,
        )
    )
    board.add(
        timeseries_panel(
            "Requests per second by engine",
            EVENTS_PER_S,
            [
                Query(
                    _sum_rate("gateway_engine_requests_total", GATEWAYS, "engine"),
                    "engine {{engine}}",
                ),
                Query(
                    _sum_rate("gateway_engine_failovers_total", GATEWAYS, "engine"),
                    "failovers from engine {{engine}}",
                ),
            ],
            description=(
                "How the gateways spread requests over the engines (label: the engine's "
                "host:port), and requests that failed on an engine before a response and were "
                "sent to another."
            ),
            width=8,
        )
    )
    board.add(
        timeseries_panel(
            "Upstream errors per second by kind",
            EVENTS_PER_S,
            [
                Query(_sum_rate("gateway_upstream_errors_total", GATEWAYS, "kind"), "{{kind}}"),
                Query(
                    _sum_rate("gateway_engine_discovery_errors_total", GATEWAYS, "instance"),
                    "engine discovery at {{instance}} (DNS unanswered)",
                ),
            ],
            description=(
                "connect, timeout, reset, status_5xx, in_band (an SSE error after the 200), "
                "bad_json, bad_sse, missing_usage; and engine lookups the DNS server left "
                "unanswered (a dns+ upstream keeps its last answer meanwhile)."
            ),
            width=8,
        )
    )
    board.add(
        timeseries_panel(
            "Write and sync failures per second",
            EVENTS_PER_S,
            [
                Query(
                    _sum_rate("gateway_budget_flush_failures_total", GATEWAYS, "instance"),
                    "budgets {{instance}}",
                ),
                Query(
                    _sum_rate("gateway_usage_write_failures_total", GATEWAYS, "instance"),
                    "usage ledger {{instance}}",
                ),
                Query(
                    _sum_rate("gateway_adapter_sync_errors_total", GATEWAYS, "instance"),
                    "adapter sync {{instance}}",
                ),
            ],
            description=(
                "Failed writes of day/month budgets to keys.db and of the usage ledger (keys.db "
                "or Redis), both retried; runtime LoRA adapter loads or unloads an engine "
                "refused (retried every round)."
            ),
            width=8,
        )
    )
    return board.to_json()
