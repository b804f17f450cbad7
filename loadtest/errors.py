"""The one error type of the load-test harness: a message for the operator, no traceback."""

from __future__ import annotations


class LoadTestError(Exception):
    """A bad input (workload, targets, options) or a run that could not take place."""
