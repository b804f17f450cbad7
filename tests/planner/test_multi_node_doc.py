"""docs/multi-node.md quotes two `serving plan` runs in excerpts (`...` for lines left out):
each command still runs and prints every quoted line, in that order."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from serving.cli import main

DOC = Path(__file__).resolve().parents[2] / "docs" / "multi-node.md"
BLOCK = re.compile(r"^```\n\$ \.venv/bin/(serving plan [^\n]*)\n(.*?)^```", re.M | re.S)


def quoted_runs() -> list[tuple[str, list[str]]]:
    runs = [(m.group(1), m.group(2).splitlines()) for m in BLOCK.finditer(DOC.read_text())]
    return [(command, [line for line in lines if line != "..."]) for command, lines in runs]


def test_the_page_quotes_the_plan_and_the_profile() -> None:
    assert [command.split()[2] for command, _ in quoted_runs()] == ["--model", "--profile"]


@pytest.mark.parametrize(("command", "quoted"), quoted_runs(), ids=lambda v: str(v)[:50])
def test_each_quoted_line_is_printed_in_order(
    command: str, quoted: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    main(shlex.split(command)[1:])
    printed = capsys.readouterr().out.splitlines()
    at = 0
    for line in quoted:
        assert line in printed[at:], f"{line!r} not printed (in order) by {command}"
        at = printed.index(line, at) + 1
