"""MkDocs hook: the repository's Markdown outside docs/ becomes part of the site, and every
relative link is checked against the repository.

Pages are written to be read on GitHub as well as in the site, so each links as GitHub reads
it, relative to its own file: docs/kubernetes.md links `../k8s/README.md`, README.md links
`docs/gateway.md`. The site is docs/ plus the files in OUTSIDE (README.md is its home page).
Before MkDocs checks a page's links, on_page_markdown rewrites every relative link whose
target is one of the site's pages (or images) to that target's place in the site, and warns
about a link to anything else outside docs/ (a source file, a missing file), which strict mode
turns into a failed build. Links inside docs/ are left to MkDocs' own checks (mkdocs.yml,
`validation:`). Inline links only (`[text](target)`, `![alt](target)`), outside code.
docs/contributing-docs.md says why.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.plugins import get_plugin_logger
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

log = get_plugin_logger(__name__)

# Repository path -> the page's path in the site.
OUTSIDE = {
    "README.md": "index.md",
    "k8s/README.md": "k8s/README.md",
    "monitoring/RUNBOOK.md": "monitoring/RUNBOOK.md",
}

# An inline code span (kept as it is) or an inline link's target.
CODE_OR_LINK = re.compile(r"(?P<code>`+)(?:.*?)(?P=code)|\]\((?P<target>[^)\s]+)\)")
FENCE = re.compile(r"^ *(```|~~~)")


def _root(config: MkDocsConfig) -> Path:
    return Path(config.config_file_path).resolve().parent


def _docs(config: MkDocsConfig) -> str:
    return Path(config.docs_dir).resolve().relative_to(_root(config)).as_posix()


def on_files(files: Files, config: MkDocsConfig) -> Files:
    root = _root(config)
    for repo_path, site_path in OUTSIDE.items():
        if files.get_file_from_path(site_path) is not None:
            log.warning("%s would be %s in the site, which docs/ already has", repo_path, site_path)
            continue
        files.append(File.generated(config, site_path, abs_src_path=str(root / repo_path)))
    return files


def site_target(target: str, page_repo_path: str, page_site_path: str, config: MkDocsConfig) -> str:
    """The target as the site holds it; a warning (and the target unchanged) when the site
    does not hold it."""
    if "://" in target or target.startswith(("#", "/", "mailto:")):
        return target  # absolute: MkDocs' own validation (`absolute_links`) judges it
    path, hash_, fragment = target.partition("#")
    repo_path = posixpath.normpath(posixpath.join(posixpath.dirname(page_repo_path), path))
    docs = _docs(config)
    if repo_path in OUTSIDE:
        site_path = OUTSIDE[repo_path]
    elif repo_path.startswith(docs + "/"):
        site_path = repo_path.removeprefix(docs + "/")
    else:
        exists = (_root(config) / repo_path).exists() and not repo_path.startswith("../")
        log.warning(
            "%s links to %s, %s", page_repo_path, target,
            "a file outside docs/ that the site does not hold (name it in `backticks`, "
            "or add it to OUTSIDE in mkdocs_hooks.py)" if exists else "which does not exist",
        )  # fmt: skip
        return target
    relative = posixpath.relpath(site_path, posixpath.dirname(page_site_path) or ".")
    return relative + hash_ + fragment


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    site_path = page.file.src_uri
    by_site = {site: repo for repo, site in OUTSIDE.items()}
    repo_path = by_site.get(site_path, f"{_docs(config)}/{site_path}")

    def rewrite(match: re.Match[str]) -> str:
        target = match.group("target")
        if target is None:
            return match.group(0)
        return f"]({site_target(target, repo_path, site_path, config)})"

    lines, fenced = [], False
    for line in markdown.split("\n"):
        if FENCE.match(line):
            fenced = not fenced
        lines.append(line if fenced or FENCE.match(line) else CODE_OR_LINK.sub(rewrite, line))
    return "\n".join(lines)
