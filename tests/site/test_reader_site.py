"""The reader editions against the built site (no browser): the same glued text, the same figure
numbers, and every link of a reader edition into the site lands on a page and an anchor it has.

tools/reader_edition.py reimplements what the site's build does (myst-nb's glue roles, Sphinx's
figure numbering): these tests hold it to what the build actually wrote.
"""

from __future__ import annotations

import html
import json
import re
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from sitecheck import READER_EDITIONS, ROOT

sys.path.insert(0, str(ROOT / "tests"))
from _tools import load_tool  # noqa: E402

reader = load_tool("reader_edition")
CHAPTERS = sorted(p.name for p in (ROOT / "chapters").glob("*.ipynb"))


class _Pasted(HTMLParser):
    """The text of every myst-nb pasted value (`<span class="pasted-text">`), in page order, and
    every figure's id with its caption number."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.pasted: list[str] = []
        self.ids: set[str] = set()
        self._depth = 0  # > 0 inside a pasted-text span

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"] or "")
        if tag == "span" and "pasted-text" in (a.get("class") or "").split():
            self._depth = 1
            self.pasted.append("")
        elif tag == "span" and self._depth:
            self._depth += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "span" and self._depth:
            self._depth -= 1

    def handle_data(self, data: str) -> None:
        if self._depth:
            self.pasted[-1] += data


def _parse(path: Path) -> _Pasted:
    parser = _Pasted()
    parser.feed(path.read_text(encoding="utf-8"))
    return parser


@pytest.fixture(scope="module")
def book():
    return reader.Book()


@pytest.mark.parametrize("name", CHAPTERS)
def test_glued_values_are_the_text_the_site_shows(name, site, book):
    chapter = json.loads((ROOT / "chapters" / name).read_text(encoding="utf-8"))
    _, ctx = reader.render_notebook(chapter, book)
    page = site / "chapters" / Path(name).with_suffix(".html").name
    assert [text for _, text in ctx.glued] == _parse(page).pasted


def test_figure_numbers_are_the_sites(site, book):
    numbers = book.figure_numbers
    seen = {}
    for page in sorted(site.rglob("*.html")):
        text = page.read_text(encoding="utf-8")
        for m in re.finditer(r'<figure[^>]*\bid="([^"]+)".*?caption-number">Fig\. (\d+)', text,
                             re.S):  # fmt: skip
            seen[m.group(1)] = (int(m.group(2)), page.relative_to(site).as_posix())
    assert seen, "no numbered figure in the site"
    ours = {label: (n, url.removeprefix(book.site)) for label, (n, url) in numbers.items()}
    assert ours == seen


def test_links_of_the_reader_editions_land_on_the_site(site, book):
    problems, checked = [], 0
    for name in CHAPTERS:
        nb = json.loads((READER_EDITIONS / name).read_text(encoding="utf-8"))
        text = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
        for url in re.findall(r"\]\((" + re.escape(book.site) + r"[^)\s]*)\)", text):
            path, _, anchor = html.unescape(url).removeprefix(book.site).partition("#")
            target = site / path
            checked += 1
            if not target.is_file():
                problems.append(f"{name}: {url} -> no page {path}")
            elif anchor and anchor not in _parse(target).ids:
                problems.append(f"{name}: {url} -> no id {anchor!r} in {path}")
    assert checked >= 20
    assert not problems, "\n  ".join(problems)
