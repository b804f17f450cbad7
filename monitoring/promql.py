"""The metric names a PromQL expression reads, without a PromQL parser.

    metric_names('sum by (le) (rate(vllm:e2e_request_latency_seconds_bucket{instance=~"$i"}[5m]))')
    -> {"vllm:e2e_request_latency_seconds_bucket"}

Every query under monitoring/ must name only series that a real scrape of this stack exports
(issue 9); tests collect the names with this and check them. The rules, in order: string
literals go (after noting `__name__="..."` matchers), then Grafana variables (`$x`, `${x}`,
`[[x]]`), label matchers `{...}`, ranges and subqueries `[...]`, and the label lists of
`by`/`without`/`on`/`ignoring`/`group_left`/`group_right`. What is left is a metric name when it
is an identifier not called like a function (`rate(`, `sum (`) and not an operator keyword.
Recording-rule names (`level:metric:operation`) are metric names too.
"""

from __future__ import annotations

import re

_NAME_MATCHER = re.compile(r"""__name__\s*=\s*(?:"((?:[^"\\]|\\.)*)"|'((?:[^'\\]|\\.)*)')""")
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_VARIABLES = re.compile(r"\$\{[^}]*\}|\$\w+|\[\[\w+\]\]")
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGES = re.compile(r"\[[^\[\]]*\]")
_LABEL_LISTS = re.compile(
    r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", re.IGNORECASE
)
_IDENTIFIER = re.compile(r"(?<![\w:.])([A-Za-z_:][\w:]*)(\s*\()?")
_KEYWORDS = frozenset(
    {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right"}
    | {"bool", "offset", "atan2", "inf", "nan"}
)


def metric_names(expr: str) -> set[str]:
    """The metric names `expr` selects (see the module docstring for what counts)."""
    names = {a or b for a, b in _NAME_MATCHER.findall(expr)}
    text = _STRINGS.sub('""', expr)
    text = _VARIABLES.sub(" ", text)
    text = _MATCHERS.sub(" ", text)
    text = _RANGES.sub(" ", text)
    text = _LABEL_LISTS.sub(" ", text)
    for match in _IDENTIFIER.finditer(text):
        name, called = match.group(1), match.group(2)
        if called is None and name.lower() not in _KEYWORDS:
            names.add(name)
    return names


LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(?:(.*),\s*)?([A-Za-z_]\w*)\s*\)\s*$", re.DOTALL)


def variable_selector(query: str) -> str | None:
    """The series selector of a Grafana `label_values(selector, label)` variable query."""
    match = LABEL_VALUES.match(query)
    return match.group(1) if match else None
