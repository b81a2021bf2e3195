"""Every link between the docs leads somewhere: a relative link of README.md or docs/*.md names a file that exists
(and a heading of it, after `#`), and every `docs/...` file the code, the tests, pyproject.toml or the Makefile name
exists (issue 61, item 4b: docs/search.md and pyproject.toml linked a docs/stores.md that was never written)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, markup and punctuation dropped (not - or _), spaces to -."""
    text = re.sub(r"`|\*\*?|<[^>]+>", "", heading.strip()).lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link in a heading: its text
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of a markdown page: its headings' (a repeated one numbered -1, -2, ...) and any HTML ids."""
    text = FENCE.sub("", page.read_text())
    seen: dict[str, int] = {}
    out = set(re.findall(r"""(?:id|name)=["']([^"']+)["']""", text))
    for heading in re.findall(r"^#{1,6} (.+?)#*$", text, re.M):
        slug = _slug(heading)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def broken_links(pages: list[Path]) -> list[str]:
    """``page: target (why)`` for each relative link of ``pages`` to a missing file or heading."""
    bad = []
    for page in pages:
        for target in LINK.findall(FENCE.sub("", page.read_text())):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                bad.append(f"{page.relative_to(REPO)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                bad.append(f"{page.relative_to(REPO)}: {target} (no such heading in {dest.name})")
    return bad


def test_every_link_of_the_docs_leads_to_a_file_and_heading_that_exist() -> None:
    assert len(DOCS) > 10
    bad = broken_links(DOCS)
    assert not bad, "links to nothing:\n" + "\n".join(bad)


def test_every_docs_file_the_code_names_exists() -> None:
    sources = [REPO / "pyproject.toml", REPO / "Makefile"]
    for folder, pattern in (
        ("dab_pipeline", "*.py"),
        ("dab_pipeline", "*.j2"),
        ("tests", "*.py"),
        ("benchmarks", "*.py"),
    ):
        sources += sorted((REPO / folder).rglob(pattern))
    named = 0
    bad = []
    for src in sources:
        if src == Path(__file__):  # its own check names pages that do not exist, on purpose
            continue
        for name in re.findall(r"\bdocs/([\w.-]+\.(?:md|png|svg|jpg))", src.read_text()):
            named += 1
            if not (REPO / "docs" / name).is_file():
                bad.append(f"{src.relative_to(REPO)}: docs/{name}")
    assert named > 50, named  # the search found the code's references
    assert not bad, "the code names docs files that do not exist:\n" + "\n".join(bad)


def test_the_check_catches_a_link_to_a_missing_page_or_heading(tmp_path: Path, monkeypatch) -> None:
    """The check itself, on a page that links a missing file and a missing heading (and two that exist)."""
    monkeypatch.setattr(f"{__name__}.REPO", tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "here.md").write_text("# Here\n\n## A `code` heading: with punctuation\n")
    page = tmp_path / "docs" / "index.md"
    page.write_text(
        "[ok](here.md) [ok too](here.md#a-code-heading-with-punctuation) [gone](stores.md) [nope](here.md#nowhere)\n"
        "```\n[in a code block](ignored.md)\n```\n"
    )
    assert broken_links([page]) == [
        "docs/index.md: stores.md (no such file)",
        "docs/index.md: here.md#nowhere (no such heading in here.md)",
    ]
