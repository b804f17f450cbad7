"""docs/capacity.md shows `serving plan` output: each quoted run must still print exactly that."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from serving.cli import main

DOC = Path(__file__).resolve().parents[2] / "docs" / "capacity.md"
BLOCK = re.compile(r"^```\n\$ (serving plan [^\n]*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def quoted_runs() -> list[tuple[str, str]]:
    return [(match.group(1), match.group(2)) for match in BLOCK.finditer(DOC.read_text())]


def test_the_doc_quotes_the_deployments_the_issue_names() -> None:
    assert len(quoted_runs()) >= 8


@pytest.mark.parametrize(("command", "printed"), quoted_runs(), ids=lambda v: str(v)[:60])
def test_quoted_output_is_current(
    command: str, printed: str, capsys: pytest.CaptureFixture[str]
) -> None:
    main(shlex.split(command)[1:])
    assert capsys.readouterr().out == printed
