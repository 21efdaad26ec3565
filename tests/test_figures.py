"""The book's drawings (book/figures/*.svg): up to date with tools/draw_figures.py (which draws
them with the package tools/figures/), drawn the same in every process, and each one a
self-contained, accessible SVG that fits a page column."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from _tools import load_tool

from transformer_lib.viz import COLORS

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "book" / "figures"
SVG_NS = "{http://www.w3.org/2000/svg}"
GENERIC_FONTS = {"sans-serif", "monospace", "serif"}
# About one page column wide (not a poster, not a thumbnail); whether the labels are readable
# is checked in pixels on the page, below (test_labels_are_at_least_12_px_where_...).
MIN_WIDTH, MAX_WIDTH, MIN_FONT = 600, 900, 10
MAX_BYTES = 40_000
EXPECTED = {
    "architecture.svg",
    *(f"where_{n:02d}.svg" for n in range(1, 9)),
    "attention_qkv.svg",
    "masks.svg",
    "multihead.svg",
    "pe_add.svg",
    "shapes.svg",
    "teacher_forcing.svg",
    "kv_cache.svg",
    "path_length.svg",
    "seq2seq.svg",
    "bahdanau.svg",
    "norm_placement.svg",
}


draw = load_tool("draw_figures")
# The drawing library; loading draw_figures put its folder, tools/, on sys.path.
svglib = importlib.import_module("figures.svg")


def test_committed_drawings_are_what_the_script_draws_now(capsys):
    for name, text in draw.drawings().items():
        assert (FIGURES / name).read_bytes() == text.encode("utf-8"), (
            f"book/figures/{name} is stale: run python tools/draw_figures.py"
        )
    assert draw.main(["--check"]) == 0, capsys.readouterr().out


def _draw_in_a_new_process(out: Path, hash_seed: str, cwd: Path) -> dict[str, bytes]:
    """What `python tools/draw_figures.py --out OUT` writes, run with this hash seed and cwd."""
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    script = Path(draw.__file__).resolve()
    done = subprocess.run(
        [sys.executable, str(script), "--out", str(out)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"wrote {len(EXPECTED)} drawing(s) to {out}"
    return {p.name: p.read_bytes() for p in out.glob("*.svg")}


def test_drawing_is_deterministic_across_processes(tmp_path):
    """Two fresh interpreters with different hash seeds (so sets of strings iterate in
    different orders) and working directories write the same bytes: the committed files."""
    first = _draw_in_a_new_process(tmp_path / "a", "0", cwd=ROOT)
    second = _draw_in_a_new_process(tmp_path / "b", "4242", cwd=tmp_path)
    assert set(first) == EXPECTED
    assert first == second
    assert first == {name: (FIGURES / name).read_bytes() for name in EXPECTED}


def test_check_fails_on_a_stale_or_missing_drawing_and_a_run_repairs_it(tmp_path, capsys):
    assert draw.main(["--out", str(tmp_path)]) == 0
    assert draw.main(["--check", "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {len(EXPECTED)} drawing(s) to {tmp_path}"
    good = (tmp_path / "masks.svg").read_bytes()
    (tmp_path / "masks.svg").write_text("<svg/>", encoding="utf-8")
    (tmp_path / "kv_cache.svg").unlink()
    # the same text with Windows line endings is stale too: the files are compared as bytes
    crlf = (tmp_path / "shapes.svg").read_bytes().replace(b"\n", b"\r\n")
    (tmp_path / "shapes.svg").write_bytes(crlf)
    assert draw.main(["--check", "--out", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    stale = set(re.findall(r"\w+\.svg", out.rsplit("): ", 1)[1]))  # after the folder
    assert stale == {"masks.svg", "kv_cache.svg", "shapes.svg"}, out
    assert (tmp_path / "masks.svg").read_bytes() == b"<svg/>"  # --check writes nothing
    assert not (tmp_path / "kv_cache.svg").exists()
    # a run without --check rewrites exactly the stale files
    assert draw.main(["--out", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == f"wrote 3 drawing(s) to {tmp_path}"
    assert (tmp_path / "masks.svg").read_bytes() == good
    assert draw.main(["--check", "--out", str(tmp_path)]) == 0


def test_the_expected_files_and_no_others():
    assert set(draw.drawings()) == EXPECTED
    assert {p.name for p in FIGURES.glob("*.svg")} == EXPECTED


def test_palette_is_the_plots_palette():
    assert svglib.PALETTE == COLORS


def test_a_label_too_wide_for_its_box_is_refused():
    svg = svglib.Svg(800, 100, "t", "d")
    svg.box(0, 0, 100, 40, ["fits"], fill="#ffffff")
    assert len(svg.parts) == 2  # the box and its label
    with pytest.raises(ValueError, match="'multi-head attention' is too wide"):
        svg.box(0, 0, 40, 40, ["multi-head attention"], fill="#ffffff")
    with pytest.raises(ValueError, match="too tall"):
        svg.box(0, 0, 100, 20, ["one", "two"], fill="#ffffff")
    assert len(svg.parts) == 2  # a refused box draws nothing, not half a box
    # the same label fits once the box is as wide as the estimate (DejaVu Sans, 0.62 em)
    room = svglib.text_width("multi-head attention", 12) + 6
    svg.box(0, 0, room, 40, ["multi-head attention"], fill="#ffffff")


def test_sub_and_superscripts_become_tspans():
    svg = svglib.Svg(800, 100, "t", "d")
    svg.text(0, 10, "W^{Q} x_{i}", size=10)
    root = ET.fromstring(svg.render())
    text = root.find(f"{SVG_NS}text")
    assert "".join(text.itertext()) == "WQ xi"
    tspans = list(text.iter(f"{SVG_NS}tspan"))
    assert [t.text for t in tspans if t.get("font-size")] == ["Q", "i"]
    assert {t.get("font-size") for t in tspans if t.get("font-size")} == {"7"}  # 70% of 10
    # up for the superscript, back to the baseline for " x", down for the subscript
    assert [(t.text, float(t.get("dy"))) for t in tspans] == [("Q", -4), (" x", 4), ("i", 3)]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_drawing_is_a_self_contained_accessible_svg(name):
    path = FIGURES / name
    raw = path.read_text(encoding="utf-8")
    assert len(raw.encode()) < MAX_BYTES, f"{name}: {len(raw.encode())} bytes"
    root = ET.fromstring(raw)  # well-formed XML
    assert root.tag == f"{SVG_NS}svg"
    title, desc = root.find(f"{SVG_NS}title"), root.find(f"{SVG_NS}desc")
    assert title is not None and title.text and title.text.strip()
    assert desc is not None and len(desc.text.split()) >= 15, f"{name}: <desc> too short"
    x0, y0, width, height = (float(v) for v in root.get("viewBox").split())
    assert (x0, y0) == (0, 0) and MIN_WIDTH <= width <= MAX_WIDTH and 150 <= height <= width
    # width/height attributes give an <img> its natural size (naturalWidth > 0 everywhere)
    assert float(root.get("width")) == width and float(root.get("height")) == height

    texts = list(root.iter(f"{SVG_NS}text"))
    assert texts, f"{name}: no text"
    for el in root.iter():
        family = el.get("font-family")
        if family is not None:
            assert family in GENERIC_FONTS, f"{name}: font-family {family!r}"
        size = el.get("font-size")
        if size is not None and el.tag == f"{SVG_NS}text":
            assert float(size) >= MIN_FONT, f"{name}: text at font-size {size}"
        for attr, value in el.attrib.items():
            if attr.endswith("href"):
                assert value.startswith("#"), f"{name}: {attr}={value!r}"
            for ref in re.findall(r"url\(([^)]*)\)", value):
                assert ref.startswith("#"), f"{name}: url({ref})"
    for el in texts:
        assert el.get("font-family") in GENERIC_FONTS, f"{name}: text without a generic family"
    assert "@import" not in raw and root.find(f".//{SVG_NS}image") is None
    assert root.find(f".//{SVG_NS}style") is None and root.find(f".//{SVG_NS}script") is None


def test_readme_describes_every_drawing():
    readme = (FIGURES / "README.md").read_text(encoding="utf-8")
    for name in sorted(EXPECTED):
        section = readme.split(f"## `{name}`", 1)
        assert len(section) == 2, f"README.md has no section for {name}"
        body = section[1].split("\n## ", 1)[0]
        assert "Alt text:" in body and "Caption:" in body, f"README.md, {name}"


# ------------------------------------------------------------------ label size on the page
# The width of the book's text column, in CSS px: sphinx-book-theme 1.3 on pydata-sphinx-theme
# 0.17 at the 1280 x 900 viewport of the site tests (tests/site/sitecheck.py). The page is 1280
# px wide (the theme caps it at 88rem = 1408); the left sidebar takes 20% (256), leaving 1024
# for the main column; from 1200 px up the right-hand "contents" sidebar takes 17rem (272), so
# the article is 752 px, and its padding of 2rem on each side leaves 688 px for a figure.
# (Wider windows give up to 790 px; between 1200 and 1280 it is 624 to 688.)
COLUMN_PX = 688
MIN_LABEL_PX = 12
# Sub- and superscripts are drawn at 70% of their label (svg.rich); they are held to 70% of it.
MIN_SCRIPT_PX = 0.7 * MIN_LABEL_PX
FIGURE_DIRECTIVE = re.compile(r"```\{figure\}[ \t]*(\S+)[ \t]*\n((?:[ \t]*:[\w-]+:.*\n)*)")
CHAPTERS = ROOT / "chapters"


def _markdown_sources() -> dict[str, str]:
    """Where the book's figures are placed: chapters' markdown cells and book/*.md pages."""
    out = {}
    for nb in sorted(CHAPTERS.glob("*.ipynb")):
        cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
        for i, cell in enumerate(cells):
            if cell["cell_type"] == "markdown":
                out[f"{nb.name} cell {i}"] = "".join(cell["source"]) + "\n"
    for md in sorted((ROOT / "book").glob("*.md")):
        out[md.name] = md.read_text(encoding="utf-8") + "\n"
    return out


def figure_uses(sources: dict[str, str]) -> dict[str, list[tuple[str, str | None]]]:
    """Drawing file name -> [(where, the figure's :width: option or None), ...]."""
    uses: dict[str, list[tuple[str, str | None]]] = {}
    for where, text in sources.items():
        for m in FIGURE_DIRECTIVE.finditer(text):
            width = re.search(r"^[ \t]*:width:[ \t]*(\S+)", m.group(2), re.M)
            uses.setdefault(Path(m.group(1)).name, []).append(
                (where, width.group(1) if width else None)
            )
    return uses


def display_px(width: str | None, natural: float, column: float = COLUMN_PX) -> float:
    """How wide the browser shows an <img> of natural width `natural` in a figure whose
    :width: is `width` (a percentage of the column, or pixels), at most the column."""
    if width is None:  # the SVG's own width attribute, shrunk to the column (max-width: 100%)
        return min(natural, column)
    if width.endswith("%"):
        return float(width[:-1]) / 100 * column
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(px)?", width)
    if m is None:
        raise ValueError(f"unsupported :width: {width!r} (use a percentage or px)")
    return min(float(m.group(1)), column)


def smallest_text_px(svg_text: str, shown_px: float) -> tuple[float, float]:
    """The smallest label and the smallest sub/superscript, in px, of an SVG shown `shown_px`
    wide: font-size in viewBox units times shown width / viewBox width."""
    root = ET.fromstring(svg_text)
    scale = shown_px / float(root.get("viewBox").split()[2])
    labels = [float(t.get("font-size")) for t in root.iter(f"{SVG_NS}text")]
    scripts = [float(t.get("font-size")) for t in root.iter(f"{SVG_NS}tspan") if t.get("font-size")]
    return min(labels) * scale, min(scripts or labels) * scale


def label_problems(name: str, svg_text: str, uses: list[tuple[str, str | None]]) -> list[str]:
    """Every place where drawing `name` would show a label under 12 px (or a sub/superscript
    under 70% of that); a drawing no page uses yet is measured at its natural width."""
    natural = float(ET.fromstring(svg_text).get("width"))
    problems = []
    for where, width in uses or [("(not placed yet: natural width)", None)]:
        shown = display_px(width, natural)
        label, script = smallest_text_px(svg_text, shown)
        if label < MIN_LABEL_PX or script < MIN_SCRIPT_PX:
            problems.append(
                f"{name} in {where} (:width: {width}, {shown:.0f} px wide): smallest label "
                f"{label:.1f} px, smallest sub/superscript {script:.1f} px"
            )
    return problems


def test_every_figure_directive_shows_an_existing_drawing():
    uses = figure_uses(_markdown_sources())
    assert uses, "no {figure} directive found: has the pattern broken?"
    assert set(uses) <= {p.name for p in FIGURES.glob("*.svg")}, sorted(uses)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_labels_are_at_least_12_px_where_the_book_shows_them(name):
    uses = figure_uses(_markdown_sources()).get(name, [])
    svg_text = (FIGURES / name).read_text(encoding="utf-8")
    assert label_problems(name, svg_text, uses) == []


def test_the_label_size_check_fails_on_an_8_px_label():
    # an 800-unit drawing with 10-unit labels in a 90% figure: 10 * 619 / 800 = 7.7 px
    small = svglib.Svg(800, 200, "t", "d")
    small.text(10, 20, "tiny", size=10)
    text = small.render()
    [problem] = label_problems("small.svg", text, [("ch", "90%")])
    assert "smallest label 7.7 px" in problem
    # the same drawing passes once its labels are 16 units (12.4 px) ...
    big = svglib.Svg(800, 200, "t", "d")
    big.text(10, 20, "big enough", size=16)
    assert label_problems("big.svg", big.render(), [("ch", "90%")]) == []
    # ... but not where a page shows it narrower, and a subscript counts at its own size
    assert label_problems("big.svg", big.render(), [("ch", "90%"), ("ch", "500px")])
    big.text(10, 40, "d_{k}", size=16)  # the "k" is 11.2 units: 8.7 px in a 90% figure
    assert label_problems("big.svg", big.render(), [("ch", "90%")]) == []
    big.text(10, 60, "d_{k}", size=13)  # 13 units is 10 px, its "k" 7 px
    assert len(label_problems("big.svg", big.render(), [("ch", "90%")])) == 1


def test_figure_widths_are_read_from_the_directives():
    page = (
        "text\n```{figure} ../book/figures/a.svg\n:alt: A.\n:width: 80%\n"
        ":name: fig-a\n\nCap.\n```\n"
        "```{figure} figures/b.svg\n:name: fig-b\n\nCap.\n```\n"
        "```{figure} ../book/figures/a.svg\n:width: 400px\n```\n"
    )
    uses = figure_uses({"page": page})
    assert uses == {"a.svg": [("page", "80%"), ("page", "400px")], "b.svg": [("page", None)]}
    assert display_px("80%", 900) == pytest.approx(0.8 * COLUMN_PX)
    assert display_px("400px", 900) == 400 and display_px("2000", 900) == COLUMN_PX
    assert display_px(None, 640) == 640 and display_px(None, 900) == COLUMN_PX
    with pytest.raises(ValueError, match="unsupported"):
        display_px("30em", 900)
