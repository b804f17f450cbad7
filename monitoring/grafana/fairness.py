"""Jain's fairness index over the keys backlogged in the gateways' fair queue, as PromQL: the
expression of the recording rule job:gateway_tokens:jain_index_rate5m (rules/recording.yml)
that FairShareSkewed fires on and the Gateway dashboard draws (tests/monitoring holds the
three equal; the live test evaluates it over a shorter window).

    jain_index()            # over FAIR_WINDOW
    backlogged_keys("20s")  # the keys it counts
"""

from __future__ import annotations

FAIR_WINDOW = "5m"  # the rule's window (its name's rate5m)
FAIR_SKEWED = 0.8  # FairShareSkewed's threshold (tests/monitoring holds the two equal)


def _indent(text: str, by: int = 2) -> str:
    return "\n".join(" " * by + line for line in text.splitlines())


def backlogged_keys(window: str = FAIR_WINDOW) -> str:
    """Keys with requests waiting at every sample of `window` on some replica, their series
    there since the window began: each wanted more than it got for all of the window."""
    waiting = 'gateway_queue_waiting{job="gateway"}'
    return (
        "max by (job, key) (\n"
        f"  min_over_time({waiting}[{window}]) > 0\n  and\n  {waiting} offset {window}\n)"
    )


def served_backlogged(window: str = FAIR_WINDOW) -> str:
    """Tokens/s served to each backlogged key over `window`; none for a key served nothing,
    which adds 0 to the sums and counts in `n` (taken from `backlogged_keys`)."""
    served = f'sum by (job, key) (rate(gateway_tokens_total{{job="gateway"}}[{window}]))'
    return f"{served}\nand\n{backlogged_keys(window)}"


def jain_index(window: str = FAIR_WINDOW) -> str:
    """(sum x)^2 / n / sum x^2 over the backlogged keys; nothing while fewer than two are
    backlogged or none was served anything."""
    served = served_backlogged(window)
    return (
        f"sum by (job) (\n{_indent(served)}\n) ^ 2\n/\n"
        f"(\n  count by (job) (\n{_indent(backlogged_keys(window), 4)}\n  ) > 1\n)\n/\n"
        f"(\n  sum by (job) (\n    (\n{_indent(served, 6)}\n    ) ^ 2\n  ) > 0\n)"
    )
