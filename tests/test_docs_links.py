"""Every relative link in the README and docs names a file of the repository, and every
``#anchor`` into a Markdown file names one of its headings (GitHub's heading ids)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted(
    [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "examples").glob("*.md")]
)
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")


def heading_ids(page: Path) -> set[str]:
    """The ids GitHub gives the page's headings: lower case, punctuation but ``-`` and
    ``_`` dropped, spaces to ``-``; a repeated id gets ``-1``, ``-2`` ..."""
    ids: set[str] = set()
    fenced = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        m = HEADING.match(line)
        if fenced or m is None:
            continue
        base = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
        slug, n = base, 0
        while slug in ids:
            n += 1
            slug = f"{base}-{n}"
        ids.add(slug)
    return ids


def test_heading_ids_follow_githubs_rules(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("# 4. Fleet-level indexes (`KvIndex`, `x.y`)\n## A b\n## A b\n```\n# no\n```\n")
    assert heading_ids(page) == {"4-fleet-level-indexes-kvindex-xy", "a-b", "a-b-1"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for link in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", link):  # https:, mailto: ...
            continue
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists():
            broken.append(f"{link}: no such file")
        elif anchor and target.suffix == ".md" and anchor not in heading_ids(target):
            broken.append(f"{link}: no such heading in {target.relative_to(ROOT)}")
    assert not broken, broken
