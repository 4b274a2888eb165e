"""Links between the docs resolve: relative Markdown links and their #anchors, and the
``docs/...`` paths that code and docs name in their text (docstrings and comments cite
docs/benchmarks.md and the dated logs under docs/experiments/ for their figures)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support import REPO

LINK = re.compile(r"\]\(([^)\s]+)\)")
DOC_PATH = re.compile(r"\bdocs/[\w./-]+\.(?:md|json|png)\b")
SOURCES = (
    "README.md",
    "docs",
    "flow",
    "spark_jobs",
    "trainers",
    "benchmarks",
    "pipelines",
    "tests",
)


def _markdown() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        heading = None if fenced else re.match(r"#+\s+(.*)", line)
        if heading:
            slug = _slug(heading.group(1))
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def test_every_relative_link_and_anchor_in_the_docs_resolves() -> None:
    broken = []
    for doc in _markdown():
        for target in LINK.findall(doc.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (doc.parent / path).resolve() if path else doc
            if not dest.exists():
                broken.append(f"{doc.relative_to(REPO)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{doc.relative_to(REPO)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_every_docs_path_named_in_code_or_docs_exists() -> None:
    missing = set()
    for name in SOURCES:
        top = REPO / name
        files = [top] if top.is_file() else [*top.rglob("*.py"), *top.rglob("*.md")]
        for source in files:
            for path in DOC_PATH.findall(source.read_text()):
                if not (REPO / path).exists():
                    missing.add(f"{source.relative_to(REPO)}: {path}")
    assert not missing, "\n".join(sorted(missing))
