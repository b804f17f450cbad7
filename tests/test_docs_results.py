"""Docs quote results files, the newest of their benchmark, and every number they quote is in it.

A page quotes measured numbers only inside a results block:

    <!-- results: bench/results/gateway_overhead/2026-12-06.md -->
    ... a sentence or a table quoting that file ...
    <!-- /results -->

(an HTML comment: the site shows only what is between). For each block: the file exists and
is the newest run in its directory (bench.results_files: one file per run, named by date);
each table's columns are named as in one of the file's tables, and each row (found by its
first cell) holds that table's values; every other number in the block occurs in the file.
docs/benchmarks.md quotes no measurement outside a block. Every bench/results/ path a page
names exists. Each check is proven able to fail on a copy of a page with one number changed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.results_files import latest
from mkdocs_hooks import OUTSIDE

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([*ROOT.glob("docs/*.md"), *(ROOT / name for name in OUTSIDE)])
BLOCK = re.compile(r"<!-- results: (?P<path>\S+) -->\n(?P<body>.*?)<!-- /results -->", re.S)
NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
LINK_TARGET = re.compile(r"\]\([^)]*\)")
RESULTS_PATH = re.compile(r"bench/results/[\w./-]+\.(?:md|json)")
# A measurement: a number with a unit or a ratio. Outside a block, docs/benchmarks.md has none.
MEASURED = re.compile(r"\d(?:[\d,]*\d)?(?:\.\d+)?\s?(?:%|ms\b|µs\b|x\b|req/s|streams/s|tokens/s)")
STRICT_PAGES = ("docs/benchmarks.md",)


@dataclass
class Table:
    header: list[str]
    rows: list[list[str]]


def cell(text: str) -> str:
    return text.replace("**", "").strip()


def tables(text: str) -> list[Table]:
    """The Markdown tables in `text`, cells stripped of bold."""
    found: list[Table] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and re.match(r"\|\s*-", lines[i + 1]):
            header = [cell(c) for c in lines[i].strip().strip("|").split("|")]
            rows: list[list[str]] = []
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append([cell(c) for c in lines[i].strip().strip("|").split("|")])
                i += 1
            found.append(Table(header, rows))
        else:
            i += 1
    return found


def numbers(text: str) -> set[str]:
    return set(NUMBER.findall(LINK_TARGET.sub("]", text)))


def column_indexes(quoted: list[str], header: list[str]) -> list[int] | None:
    """Where each quoted column is in `header` (a name used twice: its first, then its second
    place), or None when one is missing."""
    indexes: list[int] = []
    for i, name in enumerate(quoted):
        places = [j for j, other in enumerate(header) if other == name]
        nth = quoted[:i].count(name)
        if nth >= len(places):
            return None
        indexes.append(places[nth])
    return indexes


def check_table(quoted: Table, source: list[Table]) -> list[str]:
    """Each quoted row must be a row of one of the file's tables with the quoted columns."""
    owners = [(t, columns) for t in source if (columns := column_indexes(quoted.header, t.header))]
    if not owners:
        return [f"no table of the results file has the columns {quoted.header}"]
    problems: list[str] = []
    for row in quoted.rows:
        if not any([r[i] for i in columns] == row for t, columns in owners for r in t.rows):
            problems.append(f"row {' | '.join(row)!r} is no row of the results file")
    return problems


def check_block(path: str, body: str) -> list[str]:
    """What is wrong with one results block quoting `path`."""
    results = ROOT / path
    if not results.is_file():
        return [f"{path}: no such results file"]
    problems: list[str] = []
    newest = latest(results.parent, results.suffix)
    if newest != results:
        problems.append(f"{path}: not the newest run, {newest.relative_to(ROOT)} is")
    source = results.read_text(encoding="utf-8")
    source_tables = tables(source)
    for quoted in tables(body):
        problems += [f"{path}: {p}" for p in check_table(quoted, source_tables)]
    prose = "\n".join(line for line in body.splitlines() if not line.startswith("|"))
    missing = sorted(numbers(prose) - numbers(source))
    if missing:
        problems.append(f"{path}: numbers not in the file: {', '.join(missing)}")
    return problems


def page_problems(page: str, text: str) -> list[str]:
    problems = [
        f"{page}: {p}" for m in BLOCK.finditer(text) for p in check_block(m["path"], m["body"])
    ]
    problems += [
        f"{page}: names {named}, which does not exist"
        for named in RESULTS_PATH.findall(text)
        if not (ROOT / named).is_file()
    ]
    if page in STRICT_PAGES:
        outside = BLOCK.sub("", re.sub(r"```.*?```", "", text, flags=re.S))
        problems += [
            f"{page}: {m[0]!r} quoted outside a results block" for m in MEASURED.finditer(outside)
        ]
    if text.count("<!-- results:") != len(BLOCK.findall(text)):
        problems.append(f"{page}: a results block is not closed with <!-- /results -->")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_quoted_numbers_are_the_newest_results(page: Path) -> None:
    assert page_problems(str(page.relative_to(ROOT)), page.read_text(encoding="utf-8")) == []


def test_the_benchmark_page_quotes_results() -> None:
    text = (ROOT / "docs/benchmarks.md").read_text(encoding="utf-8")
    quoted = {Path(m["path"]).parent.name for m in BLOCK.finditer(text)}
    assert {"gateway_overhead", "gateway_overhead_real", "routing", "stream_usage"} <= quoted


def _edit(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


def test_a_changed_number_fails() -> None:
    text = (ROOT / "docs/benchmarks.md").read_text(encoding="utf-8")
    block = next(BLOCK.finditer(text))
    body = block["body"]
    quoted = next(t for t in tables(body) if t.rows)
    row = next(r for r in quoted.rows if NUMBER.search(r[1]))
    value = NUMBER.search(row[1])
    assert value is not None
    changed = row[1].replace(value[0], value[0] + "1", 1)
    line = next(ln for ln in body.splitlines() if ln.startswith("|") and row[0] in ln)
    edited = _edit(body, line, line.replace(f"| {row[1]} |", f"| {changed} |", 1))
    assert any(changed in p for p in check_block(block["path"], edited))
    prose = body + "\nAnd 12,345.6 more.\n"
    assert any("12,345.6" in p for p in check_block(block["path"], prose))


def test_a_stale_or_missing_results_file_fails(tmp_path: Path) -> None:
    assert check_block("bench/results/gateway_overhead/2026-01-01.md", "") != []
    assert any("does not exist" in p for p in page_problems("x.md", "see bench/results/nope.md"))


def test_a_number_outside_a_block_fails() -> None:
    text = (ROOT / "docs/benchmarks.md").read_text(encoding="utf-8")
    problems = page_problems("docs/benchmarks.md", text + "\nThe gateway kept 99% today.\n")
    assert any("99%" in p for p in problems)
