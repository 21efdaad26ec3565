"""Every page of the built book, opened in headless Chromium with all other hosts blocked.

One visit per page (see conftest.visit_page) records what happened; each test checks one thing.
"""

from __future__ import annotations

from sitecheck import (
    SCREENSHOTS,
    count_book_figures,
    drawing_names,
    drawing_of,
    notebook_source,
    page_name,
    real_alt_text,
)

# A figure smaller than this (CSS px) has not really drawn: an empty Vega view is ~0-20 px.
MIN_FIGURE_PX = 40
MIN_FIGURE_MARKS = 3


def _lines(items: list[str]) -> str:
    return "\n  ".join(items)


def test_loads_without_errors(page, visits):
    r = visits(page)
    problems = [f"console error: {e}" for e in r.console_errors]
    problems += [f"page error: {e}" for e in r.page_errors]
    assert not problems, f"{page}:\n  {_lines(problems)}"


def test_no_request_leaves_localhost(page, visits):
    r = visits(page)
    assert not r.external_requests, (
        f"{page} asked other hosts for (blocked):\n  {_lines(r.external_requests)}"
    )


def test_every_local_asset_exists(page, visits):
    r = visits(page)
    assert not r.failed_local, f"{page}: local requests that failed:\n  {_lines(r.failed_local)}"


def test_figures_draw(page, visits):
    r = visits(page)
    nb = notebook_source(page)
    expected = count_book_figures(nb) if nb else 0
    if expected:
        assert r.figures, f"{page}: the notebook has {expected} Altair figure(s); the page has none"
    assert len(r.figures) >= expected, (
        f"{page}: the notebook has {expected} Altair figures, the page shows {len(r.figures)}"
    )
    bad = []
    for f in r.figures:
        if not f["has_svg"]:
            bad.append(f"#{f['id']} ({f['label'][:60]}): no svg; text: {f['error_text']!r}")
        elif min(f["width"], f["height"]) < MIN_FIGURE_PX or f["marks"] < MIN_FIGURE_MARKS:
            bad.append(
                f"#{f['id']} ({f['label'][:60]}): nearly empty svg "
                f"({f['width']:.0f}x{f['height']:.0f} px, {f['marks']} marks)"
            )
    assert not bad, f"{page}: figures that did not draw:\n  {_lines(bad)}"


def test_figures_have_alt_text(page, visits):
    r = visits(page)
    # vega-embed replaces the container's aria-label with "Vega visualization" when the spec has
    # no description; the renderer's own fallback is "Altair figure".
    missing = [
        f"#{f['id']} (title {f['title']!r})"
        for f in r.figures
        if f["label"] in ("", "Altair figure", "Vega visualization")
    ]
    assert not missing, (
        f"{page}: figures without alt text (give the chart a description=): {missing}"
    )


def drawing_problems(images: list[dict], names: set[str]) -> list[str]:
    """What is wrong with the book's drawings (<img> of book/figures/*.svg) on one page."""
    problems = []
    for img in images:
        name = drawing_of(img["src"], names)
        if name is None:
            continue
        if not img["complete"] or img["natural_width"] <= 0 or img["natural_height"] <= 0:
            problems.append(f"{name}: did not load ({img['url']})")
        elif img["width"] < MIN_FIGURE_PX:
            problems.append(f"{name}: shown {img['width']:.0f} px wide")
        if not real_alt_text(img["alt"], img["src"]):
            problems.append(f"{name}: no alt text")
    return problems


def test_drawings_load_with_alt_text(page, visits):
    """Every drawing a page shows loads in the browser and says in words what it shows (the
    drawings are <img> of SVG files; no request leaves the site: see the test above)."""
    r = visits(page)
    problems = drawing_problems(r.images, drawing_names())
    assert not problems, f"{page}: drawings:\n  {_lines(problems)}"


def test_bound_controls_change_their_figure(page, visits):
    r = visits(page)
    n_controls = sum(f["n_range"] + f["n_select"] for f in r.figures)
    assert len(r.controls) == n_controls, (
        f"{page}: found {n_controls} bound controls but exercised {len(r.controls)}"
    )
    dead = [
        f"#{c['figure']}: {c['kind']} {c['label']!r} moved {c['from']!r} -> {c['to']!r}, "
        "the figure did not change"
        for c in r.controls
        if not c["changed"]
    ]
    assert not dead, f"{page}: controls that do nothing:\n  {_lines(dead)}"


def test_solutions_are_hidden_until_clicked(page, visits):
    r = visits(page)
    bad = [
        f"{d['title']!r}: hidden: {d['hidden_before']}, shown on click: {d['visible_after']}"
        for d in r.dropdowns
        if not (d["hidden_before"] and d["visible_after"])
    ]
    assert not bad, f"{page}: dropdowns that do not hide / reveal their content:\n  {_lines(bad)}"
    if notebook_source(page) is not None:  # a chapter: 2-4 exercises, each with a solution
        n = sum(d["title"].lower().startswith("solution") for d in r.dropdowns)
        assert n >= 2, f"{page}: {n} hidden solutions; a chapter ends with 2-4 exercises"


def test_math_is_typeset(page, visits):
    r = visits(page)
    problems = []
    if r.math_elements and not r.mjx_containers:
        problems.append(f"{r.math_elements} math elements, no mjx-container: MathJax did not run")
    problems += [f"not typeset: {m!r}" for m in r.untypeset_math]
    problems += [f"raw TeX delimiter left in the text: ...{t}..." for t in r.raw_delimiters]
    assert not problems, f"{page}:\n  {_lines(problems)}"


def test_screenshot_saved(page, visits):
    r = visits(page)
    shot = SCREENSHOTS / f"{page_name(page)}.png"
    assert r.screenshot == shot and shot.exists(), f"{page}: no screenshot at {shot}"
    # A PNG of a rendered page, not an empty file: signature plus some content.
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5_000, (
        f"{shot} is not a page screenshot"
    )
