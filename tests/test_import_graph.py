"""No import circles in `serving/`: the modules import each other as a graph without cycles.

Every import of a `serving` module counts, wherever it is written: at the top of a file,
inside a function (a lazy import is still a dependency) and under `if TYPE_CHECKING:` (an
annotation's module is one the code is written against). A strongly connected component of
more than one module is a circle; the test names its modules and the imports that close it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "serving"


def module_name(path: Path) -> str:
    """`serving/gateway/app.py` -> `serving.gateway.app`; a package is its `__init__`."""
    parts = path.relative_to(REPO).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def modules() -> dict[str, Path]:
    """Every module under `serving/`, by name."""
    return {module_name(path): path for path in sorted((REPO / PACKAGE).rglob("*.py"))}


def resolve(name: str, known: dict[str, Path]) -> str | None:
    """The module `name` is, or the one holding it (`serving.x.NAME` -> `serving.x`)."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def imported(node: ast.Import | ast.ImportFrom, here: str, is_package: bool) -> Iterator[str]:
    """The dotted names an import statement brings in (relative ones made absolute)."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    base = node.module or ""
    if node.level:
        package = here if is_package else here.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{base}" if base else package
    yield base
    yield from (f"{base}.{alias.name}" for alias in node.names)


def import_graph() -> dict[str, dict[str, int]]:
    """module -> {module it imports -> the line of its first such import}."""
    known = modules()
    graph: dict[str, dict[str, int]] = {name: {} for name in known}
    for name, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for dotted in imported(node, name, path.name == "__init__.py"):
                if dotted != PACKAGE and not dotted.startswith(PACKAGE + "."):
                    continue
                target = resolve(dotted, known)
                # `from serving.x import y` imports serving.x and, when y is a module,
                # serving.x.y too: both are edges.
                if target is not None and target != name:
                    graph[name].setdefault(target, node.lineno)
    return graph


def strongly_connected(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Tarjan's components, iteratively (no recursion limit on a long chain)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component: list[str] = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    found.append(sorted(component))
    return found


def describe(component: list[str], graph: dict[str, dict[str, int]]) -> str:
    members = set(component)
    edges = [
        f"    {source} imports {target} (line {line})"
        for source in component
        for target, line in sorted(graph[source].items())
        if target in members
    ]
    return "circle: " + ", ".join(component) + "\n" + "\n".join(edges)


def circles(graph: dict[str, dict[str, int]]) -> list[str]:
    return [describe(c, graph) for c in strongly_connected(graph) if len(c) > 1]


def test_no_module_under_serving_is_in_an_import_circle() -> None:
    found = circles(import_graph())
    assert not found, "import circles in serving/:\n" + "\n".join(found)


def test_the_graph_sees_every_kind_of_import() -> None:
    """The reader is not vacuous: a top-level import, one inside a function and one under
    TYPE_CHECKING are all edges, and a circle is found and named."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "import serving.errors\n"
        "if TYPE_CHECKING:\n"
        "    from serving.paths import BUILTIN_PREFIX\n"
        "def f():\n"
        "    from serving import ports\n"
    )
    tree = ast.parse(source)
    known = modules()
    names = {
        resolve(dotted, known)
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for dotted in imported(node, "serving.x", False)
        if dotted.startswith(PACKAGE)
    }
    assert {"serving.errors", "serving.paths", "serving.ports"} <= names
    graph = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3}, "d": {"a": 4}}
    (found,) = circles(graph)
    assert found.startswith("circle: a, b, c\n")
    assert "c imports a (line 3)" in found
    graph = import_graph()
    assert len(graph) > 100 and sum(map(len, graph.values())) > 200
