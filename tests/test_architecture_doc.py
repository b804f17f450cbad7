"""docs/architecture.md against the code it describes, so the page fails CI when it drifts.

- every reliability case number cited under tests/ or serving/ is in the page's numbered list
  (the numbering is fixed: citations stay valid only while it is);
- every "docs/architecture.md, <section>" reference there names a section of the page;
- every repository path the page writes in backticks exists;
- every `serving.<module>.<name>` step of the request path resolves (import, then getattr);
- walking the route table, every metered route is answered by `Completions.handle`, which
  calls the request's steps in the order the page lists them;
- nothing under serving/ or tests/ still cites the design note that lives outside the
  repository;
- each default the facts table gives an owner (`OWNED_DEFAULTS`) is written, in the code of
  serving/, bench/, loadtest/ and monitoring/, only by its owner and the places its row lists.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import io
import re
import textwrap
import tokenize
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "architecture.md"
SOURCES = ("serving", "tests")
# The outside design note's file name, spelled so that this file does not mention it.
OUTSIDE_NOTE = "DESIGN" + ".md"

CITATION = re.compile(r"\b[Cc]ases?\s+(\d+(?:(?:\s*,\s*and\s+|\s*,\s*|\s+and\s+)\d+)*)")
PAGE_REFERENCE = re.compile(r"docs/architecture\.md,\s+([a-z][a-z\s]*)")
HEADING = re.compile(r"^## (.+)$", re.MULTILINE)
LIST_ITEM = re.compile(r"^(\d+)\. ", re.MULTILINE)
REPO_PATH = re.compile(r"`((?:serving|tests|bench|loadtest|monitoring|k8s)/[^`\s]*)`")
DOTTED = re.compile(r"`(serving(?:\.\w+)+)`")


def page() -> str:
    return PAGE.read_text(encoding="utf-8")


def section(title: str) -> str:
    """The body of the page's `## title` section."""
    text = page()
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.DOTALL | re.MULTILINE)
    assert match is not None, f"docs/architecture.md has no section {title!r}"
    return match.group(1)


def python_files() -> list[Path]:
    return sorted(
        path
        for source in SOURCES
        for path in (ROOT / source).rglob("*.py")
        if "__pycache__" not in path.parts
    )


def comment_text(path: Path) -> str:
    """The file's text with line breaks inside comments joined, so a citation wrapped
    across two comment lines reads as one."""
    text = path.read_text(encoding="utf-8")
    return re.sub(r"\n\s*#\s*", " ", text)


def test_every_cited_reliability_case_is_in_the_page() -> None:
    numbered = {int(number) for number in LIST_ITEM.findall(section("Reliability cases"))}
    assert numbered == set(range(1, max(numbered) + 1)), "the list must be numbered 1..N"
    cited: dict[int, list[str]] = {}
    for path in python_files():
        for match in CITATION.finditer(comment_text(path)):
            for number in re.findall(r"\d+", match.group(1)):
                cited.setdefault(int(number), []).append(str(path.relative_to(ROOT)))
    assert cited, "no reliability case citation found: is the pattern still right?"
    missing = {number: files for number, files in cited.items() if number not in numbered}
    assert not missing, f"cases cited but not in docs/architecture.md: {missing}"


def test_every_reference_names_a_section_of_the_page() -> None:
    titles = [title.strip().lower() for title in HEADING.findall(page())]
    # "reliability case 3" refers to the section "Reliability cases".
    prefixes = [*titles, *(title.removesuffix("s") for title in titles)]
    wrong: list[str] = []
    for path in [*python_files(), *(ROOT / "bench").rglob("*.py")]:
        if "__pycache__" in path.parts or ".venvs" in path.parts:
            continue
        for match in PAGE_REFERENCE.finditer(comment_text(path)):
            named = " ".join(match.group(1).split())
            if not any(named.startswith(prefix) for prefix in prefixes):
                wrong.append(f"{path.relative_to(ROOT)}: {named!r}")
    assert not wrong, f"references to sections docs/architecture.md does not have: {wrong}"


def test_every_path_the_page_names_exists() -> None:
    paths = set(REPO_PATH.findall(page()))
    assert len(paths) > 20, "the page names the modules it describes"
    missing = sorted(
        path
        for path in paths
        if not (any(ROOT.glob(path)) if "*" in path else (ROOT / path).exists())
    )
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def resolve(dotted: str) -> object:
    """The object a dotted name means: the longest importable module prefix, then
    attributes (a class, then its method)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            found = getattr(found, name)
        return found
    raise ModuleNotFoundError(dotted)


def test_every_step_of_the_request_path_exists() -> None:
    steps = sorted(set(DOTTED.findall(section("The request path"))))
    assert len(steps) > 20, "each step names its module and function"
    broken: list[str] = []
    for dotted in steps:
        try:
            found = resolve(dotted)
        except (ImportError, AttributeError) as exc:
            broken.append(f"{dotted} ({type(exc).__name__}: {exc})")
            continue
        if isinstance(found, ModuleType) or not callable(found):
            broken.append(f"{dotted} (not a function, method or class)")
    assert not broken, f"request path steps that the code does not have: {broken}"


def test_no_file_cites_the_outside_design_note() -> None:
    needle = OUTSIDE_NOTE.encode()
    citing = sorted(
        str(path.relative_to(ROOT))
        for source in SOURCES
        for path in (ROOT / source).rglob("*")
        if path.is_file()
        and "__pycache__" not in path.parts
        and path.suffix != ".pyc"
        and needle in path.read_bytes()
    )
    assert not citing, (
        f"{OUTSIDE_NOTE} is not in the repository; cite docs/architecture.md instead: {citing}"
    )


def called_names(function: object) -> list[str]:
    """The last component of every call in `function`'s body, in source order
    (`self._quota.admit(...)` -> "admit")."""
    source = textwrap.dedent(inspect.getsource(function))  # type: ignore[arg-type]
    calls = [node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)]
    calls.sort(key=lambda node: (node.lineno, node.col_offset))
    names = []
    for call in calls:
        func = call.func
        if isinstance(func, ast.Attribute):
            names.append(func.attr)
        elif isinstance(func, ast.Name):
            names.append(func.id)
    return names


def handler_calls(cls: type, method: str, seen: frozenset[str] = frozenset()) -> list[str]:
    """`called_names` of `cls.method`, with the calls of the class's own private methods it
    calls (`self._wait(...)`) written out in their place: the handler's steps in source order."""
    names: list[str] = []
    for name in called_names(getattr(cls, method)):
        names.append(name)
        if name.startswith("_") and name not in seen and callable(getattr(cls, name, None)):
            names.extend(handler_calls(cls, name, seen | {method, name}))
    return names


# The life of a metered request: the functions Completions.handle calls for its steps.
REQUEST_LIFE = (
    "parse_completion_request",
    "admit",
    "check_admitted",
    "turn",
    "render_upstream_body",
    "forward",
    "_settle",
    "withdraw",
    "_record_outcome",
)


def test_each_metered_route_runs_the_steps_the_page_lists_in_its_order() -> None:
    """Walk the route table: every metered route is answered by `Completions.handle`
    (`GatewayApp._api` dispatches on `route.metered`), and that function calls the request
    path's steps in the order the page lists them; a step moved, added or dropped in either
    fails here."""
    from serving.gateway.app import GatewayApp
    from serving.gateway.completions import Completions
    from serving.gateway.route_table import ROUTES

    metered = [route for route in ROUTES.routes() if route.metered is not None]
    assert {route.metered for route in metered} == {
        "chat", "completion", "responses", "messages", "embeddings", "score", "rerank",
    }  # fmt: skip
    assert called_names(GatewayApp._api).count("handle") == 1
    # The page's steps, by their function's name, in the order it writes them.
    listed: list[str] = []
    for dotted in DOTTED.findall(section("The request path")):
        name = dotted.rsplit(".", 1)[-1]
        if name not in listed:
            listed.append(name)
    # first calls only: a step called again (a withdrawal on a later refusal) keeps its place
    calls = handler_calls(Completions, "handle")
    life = list(dict.fromkeys(name for name in calls if name in REQUEST_LIFE))
    assert sorted(set(life)) == sorted(REQUEST_LIFE), f"Completions.handle calls {life}"
    assert [name for name in listed if name in REQUEST_LIFE] == life, (
        f"Completions.handle runs {life}, the page lists {listed}"
    )


@dataclass(frozen=True)
class OwnedDefault:
    """A default the facts table gives one owner: `pattern` finds its value written as that
    default (the owner's definition included), `again` the places the row lists besides."""

    owner: str
    name: str
    pattern: str
    again: tuple[str, ...] = ()


OWNED_DEFAULTS = (
    OwnedDefault(
        "serving/vllm_limits.py",
        "DEFAULT_STREAM_INTERVAL",
        r"\bDEFAULT_STREAM_INTERVAL = 1\b|\b(?:stream_interval|tokens_per_event)\b[^=\n]*="
        r"\s*(?:Field\(default=)?1\b|\"stream_interval\": \([^)]*\(None, 1\)",
    ),
    OwnedDefault(
        "serving/gateway/settings.py",
        "retry_after_s",
        r"\bretry_after_s\b[^=\n]*=\s*(?:Field\(default=)?1\b",
    ),
    OwnedDefault(
        "serving/gateway/quota/sqlite_db.py",
        "DEFAULT_BUSY_TIMEOUT_S",
        r"(?i:busy_timeout)\w*\s*(?::[^=\n]+)?=\s*(?:5000|5\.0)\b|sqlite3\.connect\([^)]*timeout=",
    ),
    OwnedDefault(
        "serving/gateway/keys/redis_store.py",
        "DEFAULT_TIMEOUT_S",
        r"\b(?:DEFAULT_TIMEOUT_S|timeout_s)\b[^=\n]*=\s*2\.0\b",
    ),
    OwnedDefault("serving/models/tiny_model.py", "MODEL_NAME", r"[\"']qwen3-tiny[\"']"),
    OwnedDefault("monitoring/prometheus/__init__.py", "PROMETHEUS_PORT", r"\b9090\b"),
)
CODE_DIRS = ("serving", "bench", "loadtest", "monitoring")


def code_lines(path: Path) -> list[str]:
    """The file's lines with comments and docstrings (any string standing as a statement)
    blanked: a usage example in a docstring is not a second definition."""
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            for number in range(node.lineno, (node.end_lineno or node.lineno) + 1):
                lines[number - 1] = ""
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            row, column = token.start
            lines[row - 1] = lines[row - 1][:column]
    return lines


def code_files() -> list[Path]:
    return sorted(
        path
        for top in CODE_DIRS
        for path in (ROOT / top).rglob("*.py")
        if not any(part.startswith(".") or part == "__pycache__" for part in path.parts)
    )


def test_each_owned_default_is_written_only_where_the_facts_table_says() -> None:
    facts = section("Where state lives")
    files = code_files()
    assert len(files) > 100, "the code directories hold the project's modules"
    wrong: list[str] = []
    lines_of = {path: code_lines(path) for path in files}  # parsed once, searched per fact
    for fact in OWNED_DEFAULTS:
        assert f"`{fact.owner}`" in facts and f"`{fact.name}`" in facts, (
            f"the facts table does not name {fact.owner} ({fact.name})"
        )
        pattern = re.compile(fact.pattern)
        found: dict[str, list[int]] = {}
        for path in files:
            for number, line in enumerate(lines_of[path], start=1):
                if pattern.search(line):
                    found.setdefault(str(path.relative_to(ROOT)), []).append(number)
        if len(found.pop(fact.owner, [])) != 1:
            wrong.append(f"{fact.name}: {fact.owner} should write it exactly once")
        for listed in fact.again:
            if found.pop(listed, None) is None:
                wrong.append(f"{fact.name}: {listed} no longer writes it: drop it from its row")
        wrong += [
            f"{fact.name}: written again in {where}, lines {lines}"
            for where, lines in found.items()
        ]
    where = "docs/architecture.md, where state lives"
    assert not wrong, f"defaults written outside their owner ({where}): " + "; ".join(wrong)
