"""The book's drawings (book/figures/*.svg): up to date with tools/draw_figures.py (which draws
them with the package tools/figures/), drawn the same in every process, and each one a
self-contained, accessible SVG that fits a page column."""

from __future__ import annotations

import importlib
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
# One page column: a viewBox this wide shows the text at a readable size (not a poster, not a
# thumbnail); labels below MIN_FONT units would be smaller than about 8 px on the page.
MIN_WIDTH, MAX_WIDTH, MIN_FONT = 700, 900, 10
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
