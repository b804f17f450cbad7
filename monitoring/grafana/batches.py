"""The Gateway dashboard's Batches row: the Batch API's series (serving/gateway/batches/
metrics.py; docs/batches.md, operations), every key's batches together (no series of them has
a key label).

    batch_row(board)    # called by gateway.build, after the Fair sharing row

The batch share of the engines' work is the tokens charged for batch lines over all tokens
charged: what the engines spent their time on, in fcfs scheduling as well as fair.
"""

from __future__ import annotations

from monitoring.grafana.common import COUNT, EVENTS_PER_S, RATE, RATIO, Board, Query
from monitoring.grafana.common import timeseries_panel as panel

GATEWAYS = 'instance=~"$instance"'
NOT_ENDED = 'status=~"validating|in_progress|finalizing|cancelling"'
BATCH_SHARE = (
    f"sum(rate(gateway_batch_tokens_total{{{GATEWAYS}}}[{RATE}]))\n/\n"
    f"sum(rate(gateway_tokens_total{{{GATEWAYS}}}[{RATE}]))"
)


def batch_row(board: Board) -> None:
    board.row("Batches")
    board.add(
        panel(
            "Batches not ended, by status",
            COUNT,
            [Query(f"sum by (status) (gateway_batches{{{GATEWAYS}, {NOT_ENDED}}})", "{{status}}")],
            description=(
                "Batches of every key in each status before its end (validating, in_progress, "
                "finalizing, cancelling), from each gateway's batch database."
            ),
            width=6,
        )
    )
    board.add(
        panel(
            "Batch lines waiting",
            COUNT,
            [
                Query(
                    f"sum by (instance) (gateway_batch_lines_waiting{{{GATEWAYS}}})", "{{instance}}"
                )
            ],
            description=(
                "Lines of the batches in progress without a result yet: the batch queue's depth "
                "(those in flight included). Waiting while no line finishes for 30 minutes "
                "fires BatchStuck."
            ),
            width=6,
        )
    )
    board.add(
        panel(
            "Batch lines finished per second, by outcome",
            EVENTS_PER_S,
            [
                Query(
                    f"sum by (outcome) (rate(gateway_batch_lines_total{{{GATEWAYS}}}[{RATE}]))",
                    "{{outcome}}",
                )
            ],
            description=(
                "completed: a 2xx answer (the output file); failed: any other answer (the error "
                "file); expired: not run before the batch's window ended. Over 10% not completed "
                "for 15 minutes fires BatchLinesFailing."
            ),
            width=6,
        )
    )
    board.add(
        panel(
            "Batch share of tokens charged",
            RATIO,
            [Query(BATCH_SHARE, "batch lines")],
            description=(
                "Tokens charged for batch lines over all tokens charged (prompt and completion): "
                "the share of the engines' work that batches took. Batch lines take a slot only "
                "when no interactive request waits, so a high share with interactive latency "
                "unchanged is idle capacity put to use."
            ),
            width=6,
            max_value=1,
        )
    )
