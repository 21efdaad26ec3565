"""A reader edition as a notebook viewer shows it: nbconvert's HTML exporter (the Markdown
renderer family Jupyter uses) renders notebooks/NN_x.ipynb, and headless Chromium opens the page.

The page must read like the site's: the glued numbers in the text (no `{glue:text}` left), the
drawings loaded (embedded, so a lone notebook shows them), the solutions closed in `<details>`
until clicked, citations as "(Vaswani et al., 2017)". Runs with the site checks
(`make book-check`), which install the browser; it needs no built site.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from sitecheck import READER_EDITIONS, ROOT

sys.path.insert(0, str(ROOT / "tests"))
from _tools import load_tool  # noqa: E402

reader = load_tool("reader_edition")
# Chapter 8 holds the most glued numbers the issue found as placeholders; chapter 1, the
# drawings and solutions of a teaching chapter.
CHAPTERS = ["08_translation.ipynb", "01_attention.ipynb"]

_PAGE_INFO = """
() => {
  // every markdown cell's text, the folded solutions' included
  const text = Array.from(document.querySelectorAll('.jp-MarkdownCell, .text_cell_render'))
    .map(c => c.textContent).join(' ');
  const imgs = Array.from(document.querySelectorAll('.jp-MarkdownCell img, .text_cell_render img'))
    .map(i => ({alt: i.getAttribute('alt') || '', loaded: i.complete && i.naturalWidth > 0,
                width: i.getBoundingClientRect().width,
                src: (i.getAttribute('src') || '').slice(0, 30)}));
  const details = Array.from(document.querySelectorAll('details')).map(d => ({
    open: d.open, summary: (d.querySelector('summary') || {}).textContent || '',
    shown: Array.from(d.children).filter(c => c.tagName !== 'SUMMARY')
                 .some(c => c.checkVisibility()),
  }));
  return {text, imgs, details};
}
"""


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    from nbconvert import HTMLExporter

    out = tmp_path_factory.mktemp("reader_html")
    exporter = HTMLExporter()  # the lab template, as `jupyter nbconvert --to html`
    pages = {}
    for name in CHAPTERS:
        body, _ = exporter.from_filename(str(READER_EDITIONS / name))
        page = out / Path(name).with_suffix(".html").name
        page.write_text(body, encoding="utf-8")
        pages[name] = page
    return pages


def _visit(browser, page: Path) -> tuple[dict, object, object]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    # offline, like the site check: nothing but the file itself (MathJax's CDN is blocked)
    context.route("**/*", lambda r: r.continue_() if r.request.url.startswith(("file:", "data:"))
                  else r.abort())  # fmt: skip
    tab = context.new_page()
    tab.goto(page.as_uri(), wait_until="load", timeout=60_000)
    return tab.evaluate(_PAGE_INFO), tab, context


@pytest.mark.parametrize("name", CHAPTERS)
def test_a_reader_notebook_reads_like_the_site(name, rendered, browser):
    chapter = json.loads((ROOT / "chapters" / name).read_text(encoding="utf-8"))
    _, ctx = reader.render_notebook(chapter, reader.Book())
    info, tab, context = _visit(browser, rendered[name])
    try:
        text = info["text"]
        for placeholder in ("{glue", "{cite}", "{numref}", "```{", ":::{", ":class: dropdown"):
            assert placeholder not in text, placeholder
        missing = [(key, shown) for key, shown in ctx.glued if shown not in text]
        assert not missing, f"glued values not on the page: {missing[:5]}"
        assert len(ctx.glued) >= 10
        assert "(Vaswani et al., 2017)" in text or "(Sutskever" in text or "(Cho" in text
        assert "References" in text
        drawings = [i for i in info["imgs"] if i["src"].startswith("data:image/svg+xml")]
        assert drawings, "no embedded drawing on the page"
        for img in drawings:
            assert img["loaded"] and img["width"] > 200 and len(img["alt"]) > 20, img
        assert "Fig. " in text
        solutions = [d for d in info["details"] if d["summary"].strip() == "Solution"]
        assert len(solutions) >= 2
        assert not any(d["open"] or d["shown"] for d in solutions), "a solution shows unopened"
        tab.locator("details > summary").first.click()
        assert tab.evaluate(
            "() => Array.from(document.querySelector('details').children)"
            ".some(c => c.tagName !== 'SUMMARY' && c.checkVisibility())"
        ), "a solution does not open when its summary is clicked"
    finally:
        context.close()
