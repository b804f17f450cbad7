"""The docs site builds with `mkdocs build --strict`, and that build is proven able to fail.

The site is docs/ plus the Markdown files mkdocs_hooks.py adds (README.md as its home page,
k8s/README.md, monitoring/RUNBOOK.md). Each way a page can break (a link to a page or an anchor
that does not exist, a link out of docs/ to a missing file or to a file the site does not hold,
a page left out of the nav) is made in a copy of the docs, whose build must then fail naming
it; the unbroken copy must build, so each failure is the break's own. README.md stays short:
everything but the quick start, the profiles and the map of the docs lives in docs/.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mkdocs_hooks import OUTSIDE

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 250


def build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=root, capture_output=True, text=True, timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip


@pytest.fixture
def docs_copy(tmp_path: Path) -> Path:
    """docs/, mkdocs.yml, the hook and the pages it adds, laid out as in the repository."""
    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "docs", copy / "docs")
    for name in ("mkdocs.yml", "mkdocs_hooks.py", *OUTSIDE):
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, copy / name)
    return copy


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    done = build(ROOT, tmp_path / "site")
    assert done.returncode == 0, done.stderr
    site = tmp_path / "site"
    pages = ("index.html", "gateway/index.html", "k8s/index.html", "monitoring/RUNBOOK/index.html")
    for page in pages:
        assert (site / page).is_file(), page


def test_the_unbroken_copy_builds(docs_copy: Path, tmp_path: Path) -> None:
    done = build(docs_copy, tmp_path / "site")
    assert done.returncode == 0, done.stderr


BREAKS = {
    "a missing page": ("docs/gateway.md", "[gone](no-such-page.md)", "no-such-page.md"),
    "a missing anchor": ("docs/tools.md", "[gone](capacity.md#no-such-heading)", "no-such-heading"),
    "a missing file out of docs/": ("docs/kubernetes.md", "[gone](../k8s/NOPE.md)", "NOPE.md"),
    "a source file": ("docs/kubernetes.md", "[hook](../mkdocs_hooks.py)", "does not hold"),
    "a missing page, from README.md": ("README.md", "[gone](docs/no-such-page.md)", "no-such-page"),
    "a page not in the nav": ("docs/orphan.md", "# Orphan", "orphan.md"),
}


@pytest.mark.parametrize(("page", "text", "named"), BREAKS.values(), ids=BREAKS.keys())
def test_a_broken_page_fails_the_build(
    docs_copy: Path, tmp_path: Path, page: str, text: str, named: str
) -> None:
    with (docs_copy / page).open("a", encoding="utf-8") as markdown:
        markdown.write(f"\n\n{text}\n")
    done = build(docs_copy, tmp_path / "site")
    assert done.returncode != 0, done.stderr
    assert named in done.stderr, done.stderr


def test_the_readme_stays_short() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move a topic into docs/"
