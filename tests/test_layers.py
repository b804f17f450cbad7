"""docs/architecture.md's tiers hold in the code.

The page's "Layers" section has two tables (the packages under `serving/`, and the modules
inside `serving/gateway/`), each a list of tiers of units (a file or a folder). Every import in
`serving/` (module level or inside a function, not under `if TYPE_CHECKING:`) between two
units of a table must go to the same tier or a lower one, and no two units of one tier may
import each other. The commands tier is the modules `serving/cli.py`'s SUBCOMMANDS names.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from serving.cli import SUBCOMMANDS

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "architecture.md"
COMMANDS = "commands"


def module_path(name: str) -> Path | None:
    """The file a `serving...` module name is, or None when it names no module."""
    base = REPO / Path(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path.relative_to(REPO)
    return None


def tables() -> list[dict[str, int]]:
    """Each table of the page's Layers section: unit (a path) -> its tier."""
    text = PAGE.read_text(encoding="utf-8")
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    found: list[dict[str, int]] = []
    current: dict[str, int] = {}
    for line in section.splitlines():
        row = re.match(r"\| (\d+) \| (.+?) \|", line)
        if row is None:
            if current and not line.startswith("|"):
                found.append(current)
                current = {}
            continue
        tier, units = int(row.group(1)), row.group(2)
        if units.strip() == COMMANDS:
            for module, _ in SUBCOMMANDS.values():
                path = module_path(module)
                assert path is not None, module
                current[str(path)] = tier
            current["serving/cli.py"] = tier
            continue
        for unit in re.findall(r"`([^`]+)`", units):
            current[unit] = tier
    if current:
        found.append(current)
    return found


def unit_of(path: str, table: dict[str, int]) -> str | None:
    """The table's unit holding `path`: the file itself, else the deepest folder."""
    if path in table:
        return path
    folders = [unit for unit in table if unit.endswith("/") and path.startswith(unit)]
    return max(folders, key=len, default=None)


def in_type_checking(tree: ast.Module) -> set[int]:
    """The line numbers of imports under `if TYPE_CHECKING:`."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in {
            "TYPE_CHECKING",
            "typing.TYPE_CHECKING",
        }:
            for inner in node.body:
                lines.update(n.lineno for n in ast.walk(inner) if hasattr(n, "lineno"))
    return lines


def imports() -> Iterator[tuple[str, str, int]]:
    """(importing file, imported file, line) for every import of a `serving` module."""
    for path in sorted((REPO / "serving").rglob("*.py")):
        source = str(path.relative_to(REPO))
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skipped = in_type_checking(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom) or node.lineno in skipped:
                continue
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module == "serving" or node.module.startswith("serving."):
                    names = [node.module]
                    names += [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names if alias.name.startswith("serving")]
            for name in names:
                target = module_path(name)
                if target is not None and str(target) != source:
                    yield source, str(target), node.lineno


def test_the_page_has_both_tables_and_every_module_is_in_each_that_covers_it() -> None:
    top, gateway = tables()
    assert top and gateway
    for path in (REPO / "serving").rglob("*.py"):
        name = str(path.relative_to(REPO))
        assert unit_of(name, top), f"{name}: in no tier of the serving/ table"
        if name.startswith("serving/gateway/"):
            assert unit_of(name, gateway), f"{name}: in no tier of the gateway table"
    for table in (top, gateway):
        for unit in table:
            assert (REPO / unit).exists(), f"the page names {unit}, which does not exist"


def test_every_import_goes_to_its_own_tier_or_a_lower_one() -> None:
    wrong: list[str] = []
    edges: set[tuple[str, str, int]] = set()
    for number, table in enumerate(tables()):
        for source, target, line in imports():
            a, b = unit_of(source, table), unit_of(target, table)
            if a is None or b is None or a == b:
                continue
            edges.add((a, b, number))
            if table[a] < table[b]:
                wrong.append(f"{source}:{line} imports {target} (tier {table[a]} -> {table[b]})")
    for a, b, number in edges:
        if (b, a, number) in edges and a < b:
            wrong.append(f"{a} and {b} import each other")
    assert not wrong, "\n".join(wrong)


def test_the_check_sees_an_upward_import() -> None:
    """The reader of the tables is not vacuous: the planner's tier is below the engine's."""
    top, _ = tables()
    planner, engine = unit_of("serving/planner/plan.py", top), unit_of("serving/engine/x.py", top)
    assert planner and engine and top[planner] < top[engine]
    assert unit_of("serving/planner/command.py", top) == "serving/planner/command.py"
    assert sum(1 for _ in imports()) > 200
