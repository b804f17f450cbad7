"""The Capacity dashboard: the planner's prediction beside what vLLM allocated and the launcher saw.

- Planned: constants per shipped profile, computed by the planner when the dashboards are
  generated (monitoring/grafana/plans.py), shown for the profiles whose launcher is running
  (`serving_engine_startup_seconds{profile}`).
- Allocated: vLLM exports its cache config as labels of `vllm:cache_config_info`
  (`num_gpu_blocks`, `block_size`); PromQL cannot turn labels into numbers, so the table
  multiplies them with Grafana transformations.
- KV in use, in tokens: `vllm:kv_cache_usage_perc` times the planned capacity of the replica's
  model (vLLM's `model_name` is the launcher's `model`: the profile's served model name).
- Loading: the launcher's `serving_engine_*` gauges (serving/engine/launcher_metrics.py).
"""

from __future__ import annotations

from typing import Any

from grafana_foundation_sdk.models.dashboard import DynamicConfigValue

from monitoring.grafana.common import (
    BYTES,
    COUNT,
    REPLICAS,
    SECONDS,
    TOKENS,
    Board,
    Query,
    label_variable,
    running_and_waiting,
    stat_panel,
    table_panel,
    timeseries_panel,
)
from monitoring.grafana.plans import Field, ProfilePlan, planned

UID = "serving-capacity"
PROFILES = 'profile=~"$profile"'
RUNNING = f"serving_engine_startup_seconds{{{PROFILES}}}"
BLOCKS = "suffix: blocks"
CAPACITY_COLUMN = "capacity (tokens)"
BLOCKS_COLUMN = "blocks (num_gpu_blocks)"
BLOCK_SIZE_COLUMN = "block size (tokens)"

# vllm:cache_config_info's labels -> a row per replica with the capacity in tokens.
ALLOCATED_TRANSFORMATIONS: list[tuple[str, dict[str, Any]]] = [
    ("filterFieldsByName", {"include": {"names": ["instance", "num_gpu_blocks", "block_size"]}}),
    (
        "convertFieldType",
        {
            "conversions": [
                {"targetField": "num_gpu_blocks", "destinationType": "number"},
                {"targetField": "block_size", "destinationType": "number"},
            ],
            "fields": {},
        },
    ),
    (
        "calculateField",
        {
            "mode": "binary",
            "binary": {"left": "num_gpu_blocks", "operator": "*", "right": "block_size"},
            "alias": CAPACITY_COLUMN,
            "replaceFields": False,
        },
    ),
    (
        "organize",
        {
            "indexByName": {"instance": 0, "num_gpu_blocks": 1, "block_size": 2},
            "renameByName": {"num_gpu_blocks": BLOCKS_COLUMN, "block_size": BLOCK_SIZE_COLUMN},
        },
    ),
]


def _planned(
    field: Field, legend: str, plans: list[ProfilePlan] | None, *, instant: bool = False
) -> Query:
    return Query(planned(field, running=RUNNING, plans=plans), legend, instant=instant)


def build(plans: list[ProfilePlan] | None = None) -> dict[str, Any]:
    """The dashboard; `plans` defaults to the planner's for every shipped profile."""
    board = Board(
        "Serving / Capacity",
        uid=UID,
        description="KV cache planned against allocated and used; model load time and memory.",
    )
    board.variable(
        label_variable(
            "profile",
            "Profile",
            "label_values(serving_engine_startup_seconds, profile)",
            description="Profiles whose launcher is running (serving_engine_* series)",
        )
    )
    board.variable(
        label_variable(
            "instance",
            "Replica",
            "label_values(vllm:cache_config_info, instance)",
            description="vLLM servers (scrape targets exporting vllm:*)",
        )
    )
    planned_tokens = planned("kv_capacity_tokens", running=RUNNING, plans=plans)

    board.row("KV cache: planned against allocated")
    board.add(
        stat_panel(
            "Planned KV capacity",
            TOKENS,
            [_planned("kv_capacity_tokens", "{{profile}}", plans, instant=True)],
            description="The planner's KV cache size per replica (`serving plan --profile`).",
        )
    )
    board.add(
        stat_panel(
            "Planned KV blocks",
            BLOCKS,
            [_planned("kv_blocks", "{{profile}}", plans, instant=True)],
            description="The planner's number of KV blocks per replica: vLLM's num_gpu_blocks.",
        )
    )
    allocated = table_panel(
        "KV cache allocated by vLLM",
        COUNT,
        [Query(f"vllm:cache_config_info{{{REPLICAS}}}", instant=True, table=True)],
        transformations=ALLOCATED_TRANSFORMATIONS,
        description="num_gpu_blocks x block_size from vllm:cache_config_info, per replica.",
        height=5,
    )
    for column, unit in (
        (BLOCKS_COLUMN, BLOCKS),
        (BLOCK_SIZE_COLUMN, TOKENS),
        (CAPACITY_COLUMN, TOKENS),
    ):
        allocated.override_by_name(column, [DynamicConfigValue(id_val="unit", value=unit)])
    board.add(allocated)
    board.add(
        timeseries_panel(
            "KV cache in use against planned capacity",
            TOKENS,
            [
                Query(
                    f"vllm:kv_cache_usage_perc{{{REPLICAS}}}\n"
                    "* on (model_name) group_left ()\n"
                    "max by (model_name) (\n"
                    f'  label_replace({planned_tokens}, "model_name", "$1", "model", "(.*)")\n'
                    ")",
                    "in use {{instance}}",
                ),
                _planned("kv_capacity_tokens", "planned capacity {{profile}}", plans),
            ],
            description=(
                "KV cache usage (vllm:kv_cache_usage_perc) times the planned capacity of the "
                "replica's profile, against that capacity. Exact when vLLM allocated what the "
                "planner predicted (see the table above)."
            ),
        )
    )
    board.add(
        timeseries_panel(
            "Sequences against the plan",
            COUNT,
            [
                *running_and_waiting(),
                _planned("max_sequences", "planned: sequences at max_model_len {{profile}}", plans),
            ],
            description=(
                "Requests running and waiting, against the sequences of max_model_len the "
                "planner says fit at once (capped by max_num_seqs)."
            ),
        )
    )

    board.row("Model load")
    loads = [
        (
            "Model load time",
            "serving_engine_model_load_seconds",
            SECONDS,
            "spawn to weights loaded",
        ),
        ("Start to healthy", "serving_engine_startup_seconds", SECONDS, "spawn to /health"),
        ("Weights read", "serving_engine_weights_load_seconds", SECONDS, "vLLM's own figure"),
        (
            "Peak memory while loading",
            "serving_engine_load_peak_memory_bytes",
            BYTES,
            "summed PSS of vLLM's processes",
        ),
    ]
    for title, metric, unit, what in loads:
        board.add(
            stat_panel(
                title,
                unit,
                [Query(f"max by (profile) ({metric}{{{PROFILES}}})", "{{profile}}")],
                description=f"The launcher's {metric}: {what}, at the last (re)start.",
            )
        )
    board.add(
        stat_panel(
            "Engine restarts",
            COUNT,
            [
                Query(
                    f"max by (profile) (serving_engine_restarts_total{{{PROFILES}}})",
                    "{{profile}}",
                )
            ],
            description="Times the supervisor restarted vLLM since the launcher started.",
            width=8,
            height=8,
            thresholds=[(1, "orange")],
        )
    )
    board.add(
        timeseries_panel(
            "Load times per start",
            SECONDS,
            [
                Query(
                    f"max by (profile) (serving_engine_model_load_seconds{{{PROFILES}}})",
                    "model load {{profile}}",
                ),
                Query(
                    f"max by (profile) (serving_engine_startup_seconds{{{PROFILES}}})",
                    "start to healthy {{profile}}",
                ),
            ],
            description="How the launcher's figures changed across (re)starts.",
            width=16,
        )
    )
    return board.to_json()
