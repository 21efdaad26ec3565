"""The drawing checks of test_browser.py and test_static.py, on small hand-written inputs (no
built site needed): they must catch a missing map, a missing alt text, a drawing that did not
load, and pass a page that is right."""

from __future__ import annotations

from sitecheck import chapter_number, drawing_names, drawing_of
from test_browser import drawing_problems
from test_static import _Page, chapter_drawing_problems

NAMES = drawing_names()


def _tags(html: str) -> list[tuple[str, dict[str, str]]]:
    p = _Page()
    p.feed(html)
    p.close()
    return p.tags


def _img(src: str, alt: str = "A drawing.", **kw) -> dict:
    return {
        "src": src,
        "url": f"http://127.0.0.1:1/{src}",
        "alt": alt,
        "complete": True,
        "natural_width": 900,
        "natural_height": 400,
        "width": 700,
    } | kw


def test_the_book_has_its_drawings():
    assert {"architecture.svg", "where_01.svg", "where_08.svg", "multihead.svg"} <= NAMES


def test_drawing_of_recognises_only_copied_drawings():
    assert drawing_of("../_images/where_01.svg", NAMES) == "where_01.svg"
    assert drawing_of("_images/kv_cache.svg?v=1", NAMES) == "kv_cache.svg"
    assert drawing_of("../_images/plot.png", NAMES) is None
    assert drawing_of("../_static/where_01.svg", NAMES) is None
    assert drawing_of("../_images/not_a_drawing.svg", NAMES) is None


def test_chapter_number():
    assert chapter_number("chapters/03_multihead_attention.html") == 3
    assert chapter_number("chapters/09_performance.html") == 9
    assert chapter_number("book/intro.html") is None
    assert chapter_number("chapters/notes.html") is None


def test_browser_check_flags_unloaded_and_unlabelled_drawings():
    good = [_img("../_images/where_01.svg"), _img("../_images/logo.png", alt="")]
    assert drawing_problems(good, NAMES) == []
    bad = [
        _img("../_images/where_01.svg", natural_width=0),
        _img("../_images/masks.svg", alt=" "),
        _img("../_images/shapes.svg", alt=None),
        _img("../_images/pe_add.svg", complete=False),
        # Sphinx's alt text for a figure without :alt: is the image's path
        _img("../_images/kv_cache.svg", alt="../_images/kv_cache.svg"),
    ]
    found = drawing_problems(bad, NAMES)
    assert len(found) == 5
    assert [p.split(":")[0] for p in found] == [
        "where_01.svg",
        "masks.svg",
        "shapes.svg",
        "pe_add.svg",
        "kv_cache.svg",
    ]


def test_static_check_accepts_a_chapter_with_its_map_and_a_drawing():
    html = (
        '<h1>3. Multi-head</h1><img alt="Where." src="../_images/where_03.svg">'
        '<p>text</p><img alt="Heads." src="../_images/multihead.svg">'
    )
    assert chapter_drawing_problems("chapters/03_multihead_attention.html", _tags(html)) == []


def test_static_check_flags_a_missing_map_alt_text_or_drawing():
    page = "chapters/02_masks.html"
    only_map = '<img alt="Where." src="../_images/where_02.svg">'
    assert chapter_drawing_problems(page, _tags(only_map)) == [
        f"{page}: no drawing besides a where_NN.svg map"
    ]
    wrong_map = (
        '<img alt="x" src="../_images/where_03.svg"><img alt="y" src="../_images/masks.svg">'
    )
    assert (
        "the first drawing is not where_02.svg"
        in chapter_drawing_problems(page, _tags(wrong_map))[0]
    )
    late_map = '<img alt="y" src="../_images/masks.svg"><img alt="x" src="../_images/where_02.svg">'
    assert len(chapter_drawing_problems(page, _tags(late_map))) == 1
    for alt in ("", ' alt=""', ' alt="../_images/where_02.svg"'):
        no_alt = f'<img{alt} src="../_images/where_02.svg"><img alt="y" src="../_images/masks.svg">'
        assert chapter_drawing_problems(page, _tags(no_alt)) == [
            f"{page}: where_02.svg has no alt text"
        ]
