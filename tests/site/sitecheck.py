"""Helpers for the built-site checks: where the site is, which pages it has, and one browser
visit per page that records everything the tests look at. Used by conftest.py and the tests.

Environment overrides, for a site built elsewhere: `SITE_DIR` (the built html), `SITE_TOC` (the
_toc.yml it was built from), `SITE_SCREENSHOTS` (where page screenshots go) and `SITE_CHROMIUM`
(the browser binary).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SITE = Path(os.environ.get("SITE_DIR", ROOT / "_build" / "html")).resolve()
TOC = Path(os.environ.get("SITE_TOC", ROOT / "_toc.yml")).resolve()
CONFIG = ROOT / "_config.yml"
SCREENSHOTS = Path(os.environ.get("SITE_SCREENSHOTS", ROOT / "_build" / "screenshots")).resolve()
CHROMIUM = os.environ.get("SITE_CHROMIUM", "/usr/lib/chromium/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--no-first-run",
    "--no-default-browser-check",
    "--metrics-recording-only",
]
# Site folders that hold assets, not pages.
NON_PAGE_DIRS = {"_static", "_sources", "_images", "mathjax", "_downloads"}
# Pages Sphinx writes for every site, with no chapter content.
NON_CHAPTER_PAGES = {"genindex.html", "search.html", "index.html"}
# The reader editions (tools/reader_edition.py): what the launch and download buttons open.
READER_EDITIONS = ROOT / "notebooks"
# The book's drawings (tools/draw_figures.py); Sphinx copies the ones a page uses to _images/.
FIGURES = ROOT / "book" / "figures"


# --------------------------------------------------------------------------- discovery


def page_name(page: str) -> str:
    """`chapters/01_attention.html` -> `01_attention` (also the screenshot's file name)."""
    return Path(page).stem


def toc_files(toc: Path = TOC) -> list[str]:
    """Every document named in _toc.yml (root first), as paths without suffix."""
    import yaml

    data = yaml.safe_load(toc.read_text(encoding="utf-8"))
    out = [data["root"]]

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if "file" in node:
                out.append(node["file"])
            for key in ("parts", "chapters", "sections"):
                for child in node.get(key, []) or []:
                    walk(child)
        elif isinstance(node, list):
            for child in node:
                walk(child)

    walk({k: v for k, v in data.items() if k != "root"})
    return [str(Path(f).with_suffix("")) for f in out]


def site_pages(site: Path = SITE) -> list[str]:
    """Every content page of the built site, as paths relative to the site root."""
    pages = []
    for path in sorted(site.rglob("*.html")):
        rel = path.relative_to(site)
        if rel.parts[0] in NON_PAGE_DIRS or rel.as_posix() in NON_CHAPTER_PAGES:
            continue
        pages.append(rel.as_posix())
    return pages


def notebook_source(page: str, site: Path = SITE) -> dict | None:
    """The notebook a page was built from (Sphinx copies it to `_sources/`), or None."""
    src = site / "_sources" / Path(page).with_suffix(".ipynb")
    if not src.exists():
        return None
    return json.loads(src.read_text(encoding="utf-8"))


def notebook_outputs(nb: dict) -> list[dict]:
    return [out for cell in nb.get("cells", []) for out in cell.get("outputs", []) or []]


# Cells whose outputs Jupyter Book leaves off the page (https://jupyterbook.org/en/stable/
# interactive/hiding.html): their figures are in the notebook but not on the page.
NOT_ON_THE_PAGE = {"remove-cell", "remove-output"}


def count_book_figures(nb: dict) -> int:
    """How many figures transformer_lib.viz's `book` renderer wrote into the notebook, in
    cells whose output the page shows."""
    shown = {"cells": [c for c in nb.get("cells", [])
                       if not NOT_ON_THE_PAGE & set(c.get("metadata", {}).get("tags", []))]}
    n = 0
    for out in notebook_outputs(shown):
        html = out.get("data", {}).get("text/html", "")
        html = "".join(html) if isinstance(html, list) else html
        n += html.count('class="book-figure"')
    return n


def drawing_names(figures: Path = FIGURES) -> set[str]:
    """File names of the book's drawings (book/figures/*.svg)."""
    return {p.name for p in figures.glob("*.svg")}


def drawing_of(src: str, names: set[str]) -> str | None:
    """The drawing an <img src> shows (`../_images/where_01.svg` -> `where_01.svg`), or None for
    any other image (plots are inline SVG, not <img>; a theme logo is not a drawing)."""
    path = unquote(urlsplit(src).path)
    parts = path.split("/")
    if len(parts) >= 2 and parts[-2] == "_images" and parts[-1] in names:
        return parts[-1]
    return None


def real_alt_text(alt: str | None, src: str) -> bool:
    """True when `alt` describes the image. Sphinx writes the image's path as its alt text when
    a figure has no `:alt:`, so a file name is no alt text."""
    alt = (alt or "").strip()
    return bool(alt) and alt != src and not alt.lower().endswith((".svg", ".png", ".jpg"))


def chapter_number(page: str) -> int | None:
    """`chapters/03_multihead_attention.html` -> 3; None for a page that is not a chapter."""
    path = Path(page)
    if path.parent.name != "chapters" or not path.stem[:2].isdigit() or path.stem[2:3] != "_":
        return None
    return int(path.stem[:2])


# --------------------------------------------------------------------------- one visit per page


@dataclass
class PageReport:
    """Everything observed while a page loaded and was exercised in the browser."""

    page: str
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    external_requests: list[str] = field(default_factory=list)
    failed_local: list[str] = field(default_factory=list)
    figures: list[dict] = field(default_factory=list)  # one per .book-figure
    controls: list[dict] = field(default_factory=list)  # one per bound slider / dropdown
    math_elements: int = 0
    mjx_containers: int = 0
    untypeset_math: list[str] = field(default_factory=list)
    raw_delimiters: list[str] = field(default_factory=list)
    dropdowns: list[dict] = field(default_factory=list)  # one per dropdown admonition
    images: list[dict] = field(default_factory=list)  # one per <img>
    screenshot: Path | None = None


_FIGURES_DRAWN = """
() => Array.from(document.querySelectorAll('.book-figure')).every(el => {
  const svg = el.querySelector('svg');
  return (svg && svg.childElementCount > 0) || el.textContent.trim().length > 0;
})
"""

_FIGURE_INFO = """
() => Array.from(document.querySelectorAll('.book-figure')).map(el => {
  const svg = el.querySelector('svg');
  const box = svg ? svg.getBoundingClientRect() : null;
  return {
    id: el.id,
    label: el.getAttribute('aria-label') || '',
    has_svg: !!svg,
    width: box ? box.width : 0,
    height: box ? box.height : 0,
    marks: svg ? svg.querySelectorAll('path, rect, line, circle, text, symbol').length : 0,
    title: (svg && svg.querySelector('.role-title-text'))
           ? svg.querySelector('.role-title-text').textContent : '',
    error_text: svg ? '' : el.textContent.trim().slice(0, 300),
    n_range: el.querySelectorAll('.vega-bindings input[type=range]').length,
    n_select: el.querySelectorAll('.vega-bindings select').length,
  };
})
"""

_MATH_INFO = """
() => {
  const maths = Array.from(document.querySelectorAll('.math'));
  const untypeset = maths.filter(m => !m.querySelector('mjx-container'))
                         .map(m => m.textContent.trim().slice(0, 80));
  const article = document.querySelector('article') || document.body;
  const clone = article.cloneNode(true);
  clone.querySelectorAll('pre, code, .highlight, mjx-container, script, style, .cell_output')
       .forEach(n => n.remove());
  const text = clone.textContent;
  const raw = [];
  for (const d of ['\\\\(', '\\\\[', '$$']) {
    const i = text.indexOf(d);
    if (i >= 0) raw.push(text.slice(Math.max(0, i - 30), i + 50).replace(/\\s+/g, ' '));
  }
  return {
    n_math: maths.length,
    n_mjx: document.querySelectorAll('mjx-container').length,
    untypeset: untypeset,
    raw: raw,
  };
}
"""


# After the load event: every <img> has loaded or failed (naturalWidth 0 when it failed).
_IMAGE_INFO = """
() => Array.from(document.querySelectorAll('img')).map(img => ({
  src: img.getAttribute('src') || '',
  url: img.currentSrc || img.src || '',
  alt: img.getAttribute('alt'),
  complete: img.complete,
  natural_width: img.naturalWidth,
  natural_height: img.naturalHeight,
  width: img.getBoundingClientRect().width,
}))
"""


def _svg_markup(figure) -> str:
    return figure.evaluate(
        "el => { const s = el.querySelector('svg'); return s ? s.outerHTML : ''; }"
    )


def _wait_for_change(figure, before: str, timeout_s: float = 3.0) -> str:
    deadline = time.monotonic() + timeout_s
    after = _svg_markup(figure)
    while after == before and time.monotonic() < deadline:
        figure.page.wait_for_timeout(100)
        after = _svg_markup(figure)
    return after


def _exercise_controls(page_obj, report: PageReport) -> None:
    """Move every bound slider / dropdown once and record whether its figure's SVG changed."""
    figures = page_obj.locator(".book-figure")
    for i in range(figures.count()):
        fig = figures.nth(i)
        fig_id = fig.get_attribute("id")
        ranges = fig.locator(".vega-bindings input[type=range]")
        for j in range(ranges.count()):
            ctl = ranges.nth(j)
            lo = float(ctl.get_attribute("min") or 0)
            hi = float(ctl.get_attribute("max") or 100)
            value = float(ctl.input_value())
            target = hi if value != hi else lo  # the far end: the most visible change
            label = ctl.evaluate(
                "el => (el.closest('label') || el.parentElement).textContent.trim()"
            )
            before = _svg_markup(fig)
            ctl.fill(f"{target:g}")
            after = _wait_for_change(fig, before)
            report.controls.append(
                {
                    "figure": fig_id,
                    "kind": "range",
                    "label": label,
                    "from": value,
                    "to": target,
                    "changed": after != before and bool(after),
                }
            )
        selects = fig.locator(".vega-bindings select")
        for j in range(selects.count()):
            ctl = selects.nth(j)
            options = ctl.locator("option").evaluate_all("os => os.map(o => o.value)")
            current = ctl.input_value()
            others = [o for o in options if o != current]
            label = ctl.evaluate(
                "el => (el.closest('label') || el.parentElement).textContent.trim()"
            )
            if not others:
                report.controls.append(
                    {
                        "figure": fig_id,
                        "kind": "select",
                        "label": label,
                        "changed": False,
                        "from": current,
                        "to": None,
                    }
                )
                continue
            before = _svg_markup(fig)
            ctl.select_option(others[-1])
            after = _wait_for_change(fig, before)
            report.controls.append(
                {
                    "figure": fig_id,
                    "kind": "select",
                    "label": label,
                    "from": current,
                    "to": others[-1],
                    "changed": after != before and bool(after),
                }
            )


def _exercise_dropdowns(page_obj, report: PageReport) -> None:
    """Each dropdown admonition (the exercises' solutions) is closed, and opens when clicked."""
    drops = page_obj.locator(".admonition.dropdown")
    for i in range(drops.count()):
        drop = drops.nth(i)
        title = drop.locator(".admonition-title").first
        body = drop.locator(":scope > :not(.admonition-title)")
        n = body.count()
        hidden_before = n > 0 and not any(body.nth(k).is_visible() for k in range(n))
        title.click()
        deadline = time.monotonic() + 2.0
        visible_after = False
        while not visible_after and time.monotonic() < deadline:
            visible_after = any(body.nth(k).is_visible() for k in range(n))
            if not visible_after:
                page_obj.wait_for_timeout(100)
        report.dropdowns.append(
            {
                "title": title.inner_text().strip(),
                "hidden_before": hidden_before,
                "visible_after": visible_after,
            }
        )


def visit_page(browser, base_url: str, page: str) -> PageReport:
    report = PageReport(page=page)
    host = urlsplit(base_url).netloc
    context = browser.new_context(viewport={"width": 1280, "height": 900}, service_workers="block")

    def route(route_obj) -> None:
        url = route_obj.request.url
        parts = urlsplit(url)
        if parts.scheme in ("data", "blob", "about") or parts.netloc == host:
            route_obj.continue_()
        else:
            report.external_requests.append(url)
            route_obj.abort()

    context.route("**/*", route)
    page_obj = context.new_page()
    page_obj.on(
        "console",
        lambda m: (
            report.console_errors.append(f"{m.text} @ {m.location.get('url', '')}")
            if m.type == "error"
            else None
        ),
    )
    page_obj.on("pageerror", lambda e: report.page_errors.append(str(e)))

    def on_response(resp) -> None:
        if urlsplit(resp.url).netloc == host and resp.status >= 400:
            report.failed_local.append(f"{resp.status} {resp.url}")

    page_obj.on("response", on_response)
    page_obj.on(
        "requestfailed",
        lambda r: (
            report.failed_local.append(f"{r.failure} {r.url}")
            if urlsplit(r.url).netloc == host
            else None
        ),
    )
    try:
        page_obj.goto(f"{base_url}/{page}", wait_until="load", timeout=30_000)
        try:
            page_obj.wait_for_function(_FIGURES_DRAWN, timeout=15_000)
        except Exception:  # the figure checks below say which figure did not draw
            pass
        if page_obj.locator(".math").count():
            try:
                page_obj.wait_for_function(
                    "() => window.MathJax && MathJax.startup && MathJax.startup.promise",
                    timeout=15_000,
                )
                page_obj.evaluate("() => MathJax.startup.promise.then(() => true)")
            except Exception:  # reported by the math check
                pass
        report.figures = page_obj.evaluate(_FIGURE_INFO)
        report.images = page_obj.evaluate(_IMAGE_INFO)
        math = page_obj.evaluate(_MATH_INFO)
        report.math_elements, report.mjx_containers = math["n_math"], math["n_mjx"]
        report.untypeset_math, report.raw_delimiters = math["untypeset"], math["raw"]
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        report.screenshot = SCREENSHOTS / f"{page_name(page)}.png"
        page_obj.screenshot(path=str(report.screenshot), full_page=True)
        _exercise_controls(page_obj, report)
        _exercise_dropdowns(page_obj, report)
        page_obj.wait_for_timeout(200)  # let late errors (e.g. from re-rendering) arrive
    finally:
        context.close()
    return report
